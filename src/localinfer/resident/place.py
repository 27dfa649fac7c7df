"""How long a model stays loaded (``--keep-alive``), resolved when called. Where the resident server
lives (a private folder in the data dir: sockets 0600, folder 0700) is ``resident.start``'s."""

from __future__ import annotations

from dataclasses import dataclass

from localinfer.units import FOREVER

__all__ = ["FOREVER", "KeepAlive", "show_duration"]


@dataclass(frozen=True)
class KeepAlive:
    """``--keep-alive`` on: how long the model stays loaded idle (math.inf: forever), how many at most."""

    seconds: float
    max_models: int | None = None


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
