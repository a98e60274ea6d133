"""Exceptions that carry a one-line message naming the bad field and the fix."""

from __future__ import annotations

__all__ = ["TopoOptError", "ConfigError", "PlanCheckError"]


class TopoOptError(ValueError):
    """Base class for user-facing errors.

    The CLI prints ``str(err)`` on one line and exits with code 2; no traceback.
    """


class ConfigError(TopoOptError):
    """A configuration value is invalid.

    Parameters
    ----------
    field : str
        Dotted name of the field, e.g. ``"cluster.link_bandwidth"``.
    value : object
        The offending value, echoed back to the user.
    allowed : str
        What is allowed instead, phrased as the fix.
    """

    def __init__(self, field: str, value: object, allowed: str):
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field} = {value!r}: {allowed}")

    def __reduce__(self):
        # pickled across process-pool and Ray workers: rebuild from the three fields
        return (type(self), (self.field, self.value, self.allowed))


class PlanCheckError(TopoOptError):
    """A plan (topology, rings, routes) violates an invariant."""
