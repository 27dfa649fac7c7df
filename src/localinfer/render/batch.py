"""`localinfer batch` on stderr: progress while it runs (Rich on a terminal, a plain line every few
seconds otherwise) and the summary at the end."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, TextIO
from localinfer.render.term import styled, write_line

if TYPE_CHECKING:
    from localinfer.batch.job import BatchSummary



def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def _eta(summary: BatchSummary, total: int) -> float | None:
    if summary.done == 0 or summary.wall_s <= 0:
        return None
    return (total - summary.done) * summary.wall_s / summary.done


def progress_line(summary: BatchSummary, total: int) -> str:
    tps = summary.tokens_per_s
    errors = f" ({summary.errors} error{'s' if summary.errors != 1 else ''})" if summary.errors else ""
    return (
        f"batch: {summary.done}/{total} requests{errors}, "
        f"{'-' if tps is None else f'{tps:.1f}'} tok/s, ETA {_duration(_eta(summary, total))}"
    )


class PlainBatchProgress:
    """One line every ``interval`` seconds (logs stay readable)."""

    def __init__(self, stream: TextIO | None = None, interval: float = 10.0) -> None:
        self.stream = stream or sys.stderr
        self.interval = interval
        self._last = time.monotonic()

    def __call__(self, summary: BatchSummary, total: int) -> None:
        now = time.monotonic()
        if now - self._last < self.interval or summary.done >= total:
            return
        self._last = now
        write_line(self.stream, progress_line(summary, total))

    def close(self) -> None:
        pass


class RichBatchProgress:
    """A live bar on the terminal: requests done/total, tok/s, ETA."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(
            TextColumn("batch"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(file=stream or sys.stderr),
            transient=True,
        )
        self._task = self._progress.add_task("batch", total=total, rate="")
        self._progress.start()

    def __call__(self, summary: BatchSummary, total: int) -> None:
        tps = summary.tokens_per_s
        rate = f"{tps:.1f} tok/s" if tps else ""
        if summary.errors:
            rate += f" · {summary.errors} errors"
        self._progress.update(self._task, completed=summary.done, rate=rate)

    def close(self) -> None:
        self._progress.stop()


def make_progress(total: int, stream: TextIO | None = None) -> Any:
    stream = stream or sys.stderr
    if styled(stream):
        return RichBatchProgress(total, stream)
    return PlainBatchProgress(stream)


def summary_lines(summary: BatchSummary, model: str | None = None) -> list[str]:
    s = summary
    head = f"batch: {s.requests} requests"
    if s.skipped:
        head += f" ({s.skipped} already in the output)"
    head += f" · {s.completed} answered · {s.errors} error{'s' if s.errors != 1 else ''}"
    if s.interrupted:
        head += f" · interrupted ({s.requests - s.skipped - s.done} not run)"
    lines = [head if model is None else f"{head} · {model}"]
    if s.done:
        tps = s.tokens_per_s
        decode = f" (decode {s.decode_tps:.1f} tok/s)" if s.decode_tps else ""
        # at most one sequence per request ran at once: 3 requests at --parallel 16 ran 3 at a time
        used = min(s.parallel, s.done) if s.parallel else s.done
        lines.append(
            f"tokens: {s.prompt_tokens} prompt, {s.completion_tokens} completion · wall {_duration(s.wall_s)} · "
            f"{'-' if tps is None else f'{tps:.1f}'} tok/s{decode} at parallel {used} · "
            f"latency p50 {_duration(s.latency(0.5))}, p95 {_duration(s.latency(0.95))}"
        )
    return lines


def print_summary(summary: BatchSummary, model: str | None = None, stream: TextIO | None = None) -> None:
    stream = stream or sys.stderr
    for line in summary_lines(summary, model):
        write_line(stream, line)


