"""How long a model stays loaded (``--keep-alive``), resolved when called. Where the resident server
lives (a private folder in the data dir: sockets 0600, folder 0700) is ``resident.start``'s."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from localinfer.errors import UsageError

FOREVER = math.inf
_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class KeepAlive:
    """``--keep-alive`` on: how long the model stays loaded idle (math.inf: forever), how many at most."""

    seconds: float
    max_models: int | None = None


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
        raise UsageError(f"--keep-alive must be a duration such as 5m, 30s or 1h (0: off, -1: forever), not {value!r}")
    seconds = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
    return seconds or None


def show_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds == FOREVER:
        return "forever"
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
