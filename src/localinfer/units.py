"""How sizes and durations read for people: one formatter for the store, the stats, the pre-flight and
doctor; ``--keep-alive``'s durations parsed once (the resident server's and serve's)."""

from __future__ import annotations

import math
import re

FOREVER = math.inf
_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)


def human_bytes(n: int | float | None) -> str:
    """Decimal units, as disks and model cards count them: 98.4 MB, 1.2 GB."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} TB"


def human_duration(seconds: float | None) -> str:
    """Milliseconds under ten seconds, seconds above: 412 ms, 13.4 s."""
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def human_rate(tokens_per_s: float | None) -> str:
    return "-" if tokens_per_s is None else f"{tokens_per_s:.1f} tok/s"


def json_number(x: float | None, digits: int = 3) -> float | None:
    """A figure as our JSON outputs carry it: rounded; None for missing or NaN (JSON has no NaN)."""
    if x is None or x != x:
        return None
    return round(x, digits)


def json_ms(seconds: float | None) -> float | None:
    """Seconds as milliseconds in JSON, to the microsecond."""
    return None if seconds is None else round(seconds * 1000.0, 3)


def parse_keep_alive(value: str | float | None) -> float | None:
    """``--keep-alive``: ``5m``, ``30s``, ``1h``, ``90`` (seconds); ``0``/``off`` -> None (off, the
    default); ``-1``/``forever`` -> math.inf. A bad value is a usage error."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return None if value == 0 else FOREVER if value < 0 else float(value)
    text = value.strip().lower()
    if text in ("", "0", "off", "no", "false"):
        return None
    if text in ("-1", "forever", "inf", "infinite"):
        return FOREVER
    m = _DURATION.match(text)
    if not m:
        from localinfer.errors import UsageError

        raise UsageError(f"--keep-alive must be a duration such as 5m, 30s or 1h (0: off, -1: forever), not {value!r}")
    seconds = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
    return seconds or None
