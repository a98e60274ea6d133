"""An immutable, hashable, picklable mapping for frozen dataclass fields."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

__all__ = ["FrozenDict", "freeze"]


class FrozenDict(dict):
    """A ``dict`` that refuses changes after construction.

    Unlike ``types.MappingProxyType`` it pickles (so plans, topologies and jobs can
    cross process and Ray boundaries) and hashes when its values do.
    """

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("FrozenDict is immutable")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore
    __ior__ = _refuse  # type: ignore

    def __hash__(self) -> int:  # type: ignore[override]
        try:
            return hash(frozenset(self.items()))
        except TypeError:
            return hash(repr(sorted(self.items(), key=repr)))

    def __reduce__(self):
        return (FrozenDict, (dict(self),))

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"

    def copy(self) -> dict:
        """A mutable copy."""
        return dict(self)


def freeze(mapping: Mapping | Iterable | None) -> FrozenDict:
    """``FrozenDict`` of ``mapping`` (``None`` -> empty)."""
    return mapping if isinstance(mapping, FrozenDict) else FrozenDict(mapping or {})
