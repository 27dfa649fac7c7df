"""`localinfer embed` on stderr: a progress line every few seconds for a long input, and a summary."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, TextIO

from localinfer.render.term import write_line

if TYPE_CHECKING:
    from localinfer.embed.embedding import EmbedSummary


class EmbedProgress:
    """``progress(n)``: n more inputs done; a line every ``interval`` seconds (none for a short job)."""

    def __init__(self, total: int, stream: TextIO | None = None, interval: float = 5.0) -> None:
        self.total, self.stream, self.interval = total, stream or sys.stderr, interval
        self.done = 0
        self._t0 = self._last = time.monotonic()

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last < self.interval or self.done >= self.total:
            return
        self._last = now
        rate = self.done / (now - self._t0)
        eta = (self.total - self.done) / rate if rate > 0 else None
        write_line(self.stream, f"embed: {self.done}/{self.total} inputs, {rate:.1f} inputs/s"
                                + (f", ETA {eta:.0f} s" if eta is not None else ""))  # fmt: skip


def summary_line(s: EmbedSummary, wall_s: float, model: str) -> str:
    errors = f" · {s.errors} error{'s' if s.errors != 1 else ''}" if s.errors else ""
    rate = f" · {s.embedded / wall_s:.1f} inputs/s" if wall_s > 0 and s.embedded else ""
    tokens = f" · {s.tokens} tokens" if s.tokens else ""
    return f"embed: {s.embedded}/{s.inputs} inputs embedded{errors}{tokens} · {wall_s:.2f} s{rate} · {model}"


def print_summary(s: EmbedSummary, wall_s: float, model: str, stream: TextIO | None = None) -> None:
    write_line(stream or sys.stderr, summary_line(s, wall_s, model))
