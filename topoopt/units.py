"""Parse and print quantities with units: bandwidth, sizes and durations.

Inside the code every quantity is an SI float: bytes, seconds, bits per second.
Strings such as ``"100Gbps"``, ``"25GB/s"``, ``"2MB"`` or ``"4us"`` are parsed only
at the edges (config files and the command line).

Decimal prefixes (k, M, G, T, P) are powers of 1000; binary prefixes (Ki, Mi, Gi,
Ti, Pi) powers of 1024. For bandwidth a lower-case ``b`` means bits and an
upper-case ``B`` bytes (``"25GB/s"`` is 200 Gbit/s).
"""

from __future__ import annotations

import math
import re

from topoopt.errors import ConfigError

__all__ = [
    "parse_bandwidth",
    "parse_size",
    "parse_time",
    "format_bandwidth",
    "format_size",
    "format_time",
]

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_TIME = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0,
         "min": 60.0, "h": 3600.0}

_NUMBER = r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_SIZE_RE = re.compile(_NUMBER + r"\s*(?P<prefix>Ki|Mi|Gi|Ti|Pi|[kKMGTP]?)(?P<unit>B)$")
_BW_RE = re.compile(
    _NUMBER + r"\s*(?P<prefix>Ki|Mi|Gi|Ti|Pi|[kKMGTP]?)"
    r"(?P<unit>bps|bit/s|b/s|Bps|B/s)$"
)
_TIME_RE = re.compile(_NUMBER + r"\s*(?P<unit>ns|us|µs|μs|ms|s|min|h)$")


def _number(text: object, field: str, what: str, example: str) -> float | str:
    """A plain number given as int/float (SI base unit) as a float, else the text
    (a ``str``: anything else is refused)."""
    if isinstance(text, bool):
        raise ConfigError(field, text, f"expected a {what} such as {example!r}")
    if isinstance(text, (int, float)):
        value = float(text)
        _check_value(value, text, field, what)
        return value
    if not isinstance(text, str):
        raise ConfigError(field, text, f"expected a {what} such as {example!r}")
    return text


def _check_value(value: float, text: object, field: str, what: str) -> None:
    if not math.isfinite(value):
        raise ConfigError(field, text, f"a {what} must be a finite number")
    if value < 0:
        raise ConfigError(field, text, f"a {what} must not be negative")


def _prefix(prefix: str) -> float:
    return _BINARY[prefix] if prefix in _BINARY else _DECIMAL[prefix]


def parse_size(text: str | int | float, field: str = "size") -> float:
    """Parse a data size into bytes.

    Parameters
    ----------
    text : str or number
        ``"2MB"``, ``"1.5 GiB"``, ``"512B"``; a bare number is taken as bytes.
    field : str
        Name used in the error message.

    Returns
    -------
    float
        The size in bytes.

    Raises
    ------
    ConfigError
        If the text is not a non-negative size.

    Examples
    --------
    >>> parse_size("2MB")
    2000000.0
    >>> parse_size("1KiB")
    1024.0
    """
    given = _number(text, field, "size", "2MB")
    if not isinstance(given, str):
        return given
    match = _SIZE_RE.match(given.strip())
    if not match:
        raise ConfigError(field, text, "expected a size such as '2MB', '512KiB' or '1.5GB'")
    value = float(match["num"]) * _prefix(match["prefix"])
    _check_value(value, text, field, "size")
    return value


def parse_bandwidth(text: str | int | float, field: str = "bandwidth") -> float:
    """Parse a bandwidth into bits per second.

    Parameters
    ----------
    text : str or number
        ``"100Gbps"``, ``"100 Gbit/s"``, ``"25GB/s"`` (bytes); a bare number is
        taken as bits per second.
    field : str
        Name used in the error message.

    Returns
    -------
    float
        Bits per second.

    Raises
    ------
    ConfigError
        If the text is not a positive bandwidth.

    Examples
    --------
    >>> parse_bandwidth("100Gbps")
    100000000000.0
    >>> parse_bandwidth("25GB/s")
    200000000000.0
    """
    given = _number(text, field, "bandwidth", "100Gbps")
    if not isinstance(given, str):
        number = given
    else:
        match = _BW_RE.match(given.strip())
        if not match:
            raise ConfigError(
                field, text, "expected a bandwidth such as '100Gbps', '100Gbit/s' or '25GB/s'"
            )
        bits = 8.0 if match["unit"] in ("Bps", "B/s") else 1.0
        number = float(match["num"]) * _prefix(match["prefix"]) * bits
        _check_value(number, text, field, "bandwidth")
    if number <= 0:
        raise ConfigError(field, text, "a bandwidth must be greater than zero")
    return number


def parse_time(text: str | int | float, field: str = "time") -> float:
    """Parse a duration into seconds.

    Parameters
    ----------
    text : str or number
        ``"4us"``, ``"10ms"``, ``"1.5s"``; a bare number is taken as seconds.
    field : str
        Name used in the error message.

    Returns
    -------
    float
        Seconds.

    Examples
    --------
    >>> parse_time("4us")
    4e-06
    """
    given = _number(text, field, "duration", "4us")
    if not isinstance(given, str):
        return given
    match = _TIME_RE.match(given.strip())
    if not match:
        raise ConfigError(field, text, "expected a duration such as '4us', '10ms' or '1s'")
    value = float(match["num"]) * _TIME[match["unit"]]
    _check_value(value, text, field, "duration")
    return value


def _format(value: float, steps: list[tuple[float, str]], unit_one: str) -> str:
    for scale, name in steps:
        if abs(value) >= scale:
            return f"{value / scale:.4g} {name}"
    return f"{value:.4g} {unit_one}"


def format_size(nbytes: float) -> str:
    """Print a size in bytes with a decimal prefix, e.g. ``"2 MB"``."""
    return _format(nbytes, [(1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")],
                   "B")


def format_bandwidth(bps: float) -> str:
    """Print bits per second with a decimal prefix, e.g. ``"100 Gbps"``."""
    return _format(bps, [(1e15, "Pbps"), (1e12, "Tbps"), (1e9, "Gbps"), (1e6, "Mbps"),
                         (1e3, "kbps")], "bps")


def format_time(seconds: float) -> str:
    """Print seconds in the largest unit that keeps the number >= 1, e.g. ``"4 us"``."""
    if seconds == 0:
        return "0 s"
    for scale, name in [(1.0, "s"), (1e-3, "ms"), (1e-6, "us")]:
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {name}"
    return f"{seconds / 1e-9:.4g} ns"
