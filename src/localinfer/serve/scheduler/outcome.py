"""How a served answer is assembled on the engine thread: the decoder's text pieces fed to one
``Finish`` (thinking apart from the answer, tool calls parsed) as they come or at the end, and the
``Ended`` a request ends with - finished, failed or cancelled.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from localinfer.answer.finished import Finished
from localinfer.engine.types import GenerationStats

if TYPE_CHECKING:
    from localinfer.engine.batch import SeqResult
    from localinfer.generate.finish import Finish, Step


@dataclass(frozen=True)
class Ended(Finished):
    """How a request ended: its answer, finished as on every entry (``answer.finished.Finished``:
    one finish reason, times from its arrival at the engine: ``submit``), plus what only a server
    has. ``finish_reason`` ``interrupted``: cancelled; ``error``: then ``error`` says why."""

    queue_s: float = 0.0  # waiting for a slot
    error: str | None = None


def feeder(finish: Finish, on_text: Callable[[str], None] | None,
           on_steps: Callable[[list[Step]], None] | None) -> Callable[[str], None]:  # fmt: skip
    """The decoder's ``on_text`` for an answer finished piece by piece: its steps to ``on_steps``, else
    its answer text to ``on_text`` (either may be None: wanted at the end only)."""
    from localinfer.generate.finish import Text

    def feed(piece: str) -> None:
        steps = finish.feed(piece)
        if not steps:
            return
        if on_steps is not None:
            on_steps(steps)
        elif on_text is not None:
            for step in steps:
                if isinstance(step, Text):
                    on_text(step.text)

    return feed


def finished(result: SeqResult, finish: Finish, live: bool, on_steps: Callable[[list[Step]], None] | None,
             t_arrival: float) -> Ended:  # fmt: skip
    """A sequence's end as its request's ``Ended``: ``finish`` (fed piece by piece when ``live``, else
    here with the whole text) closed, what it held back sent to ``on_steps`` first."""
    if not live:
        finish.fill(result.text)
    tail = finish.close()
    if tail and on_steps is not None:
        on_steps(tail)  # what was held back (a marker's start, a call's end), before the outcome
    done = finish.of_sequence(result, t_arrival)
    return Ended(**{f.name: getattr(done, f.name) for f in fields(Finished)}, queue_s=result.t_admit - t_arrival)


def failed(n_prompt: int, t_arrival: float, error: str | None, reason: str = "error") -> Ended:
    """A request that ended without an answer: an error, or cancelled (``interrupted``) before it ran."""
    waited = time.perf_counter() - t_arrival
    stats = GenerationStats(prompt_tokens=n_prompt, finish_reason=reason)
    return Ended("", reason, stats, total_s=waited, queue_s=waited, error=error)
