"""Progress of long store operations (downloads, hashing, assembling), always on stderr.

A Rich bar (bytes, speed, ETA) when stderr is a terminal; plain lines otherwise (a few per transfer,
so logs stay readable). Both implement :class:`localinfer.store.ProgressSink`.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

from localinfer.render.term import is_tty, write_line
from localinfer.units import human_bytes as human_size




class PlainProgress:
    """Plain lines: one when a transfer starts, one every ``interval`` seconds, one at the end."""

    def __init__(self, stream: TextIO | None = None, interval: float = 5.0) -> None:
        self.stream = stream or sys.stderr
        self.interval = interval
        self._label = ""
        self._total: int | None = None
        self._done = 0
        self._start_done = 0
        self._t0 = 0.0
        self._last = 0.0
        self._active = False

    def start(self, label: str, total: int | None, completed: int = 0) -> None:
        self._label, self._total, self._done, self._start_done = label, total, completed, completed
        self._t0 = self._last = time.monotonic()
        self._active = True
        size = human_size(total) if total is not None else "unknown size"
        resumed = f", resuming at {human_size(completed)}" if completed else ""
        write_line(self.stream, f"{label}: {size}{resumed}")

    def advance(self, nbytes: int) -> None:
        self._done += nbytes
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            write_line(self.stream, f"{self._label}: {self._status(now)}")

    def reset(self, completed: int) -> None:
        self._done = self._start_done = completed
        self._t0 = time.monotonic()

    def _status(self, now: float) -> str:
        elapsed = max(now - self._t0, 1e-9)
        speed = (self._done - self._start_done) / elapsed
        text = human_size(self._done)
        if self._total:
            pct = 100.0 * self._done / self._total
            text = f"{pct:5.1f}% {text} / {human_size(self._total)}"
            if speed > 0:
                eta = (self._total - self._done) / speed
                text += f", {human_size(speed)}/s, ETA {_duration(eta)}"
        elif speed > 0:
            text += f", {human_size(speed)}/s"
        return text

    def finish(self) -> None:
        if not self._active:
            return
        self._active = False
        now = time.monotonic()
        elapsed = max(now - self._t0, 1e-9)
        moved = self._done - self._start_done
        write_line(
            self.stream,
            f"{self._label}: done, {human_size(self._done)} in {_duration(elapsed)}"
            + (f" ({human_size(moved / elapsed)}/s)" if moved else ""),
        )

    def note(self, message: str) -> None:
        write_line(self.stream, message)


class RichProgress:
    """A Rich progress bar on stderr: description, bar, bytes done/total, speed, ETA."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._console: Any = None
        self._progress: Any = None
        self._task: Any = None
        self._pending = 0
        self._last = 0.0

    @property
    def console(self) -> Any:
        """Made on first use: commands hand a sink to every load, and most never pull."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(file=self._stream or sys.stderr, stderr=self._stream is None)
        return self._console

    def start(self, label: str, total: int | None, completed: int = 0) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.finish()
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(label, total=total, completed=completed)
        self._pending = 0
        self._last = time.monotonic()

    def advance(self, nbytes: int) -> None:
        if self._progress is None:
            return
        self._pending += nbytes
        now = time.monotonic()
        if now - self._last >= 0.1:  # Rich updates are not free: batch the per-chunk calls
            self._progress.update(self._task, advance=self._pending)
            self._pending = 0
            self._last = now

    def reset(self, completed: int) -> None:
        if self._progress is not None:
            self._pending = 0
            self._progress.reset(self._task, completed=completed)

    def finish(self) -> None:
        if self._progress is None:
            return
        if self._pending:
            self._progress.update(self._task, advance=self._pending)
            self._pending = 0
        self._progress.stop()
        self._progress = None
        self._task = None

    def note(self, message: str) -> None:
        try:
            self.console.print(message, markup=False, highlight=False)
        except (OSError, ValueError):
            pass


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def make_progress(stream: TextIO | None = None) -> PlainProgress | RichProgress:
    """A Rich bar when ``stream`` (stderr by default) is a terminal, plain lines otherwise."""
    stream = stream or sys.stderr
    tty = is_tty(stream)
    if tty and os.environ.get("TERM") != "dumb":
        return RichProgress(None if stream is sys.stderr else stream)
    return PlainProgress(stream)
