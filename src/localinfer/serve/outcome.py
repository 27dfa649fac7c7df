"""How a served answer is assembled on the engine thread: the decoder's text pieces fed to one
``Finish`` (thinking apart from the answer, tool calls parsed) as they come or at the end, and the
``Outcome`` a request ends with - finished, failed or cancelled.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localinfer.engine.types import GenerationStats

if TYPE_CHECKING:
    from localinfer.engine.batch import SeqResult
    from localinfer.generate.finish import Finish, Step
    from localinfer.request.toolcalls.spec import ToolCall


@dataclass(frozen=True)
class Outcome:
    """How a request ended. Times in seconds from its arrival (``submit``); ``finish_reason``:
    stop | length | interrupted (cancelled) | error (then ``error`` says why)."""

    text: str
    finish_reason: str | None
    stats: GenerationStats
    queue_s: float  # waiting for a slot
    ttft_s: float | None  # to the first token sampled (of the answer, after any thinking)
    total_s: float
    error: str | None = None
    reasoning: str | None = None  # the thinking, split from ``text`` (None: not a reasoning answer)
    reasoning_tokens: int | None = None
    reasoning_ttft_s: float | None = None  # to the first piece of thinking
    tool_calls: tuple[ToolCall, ...] = ()  # the calls parsed out of the answer (``text`` is the rest)

    @property
    def reason(self) -> str | None:
        """The answer's finish reason (``tool_calls`` when it ended by itself with calls);
        ``finish_reason`` is the engine's (what /metrics counts)."""
        from localinfer.request.toolcalls.plan import finish_reason

        return finish_reason(self.tool_calls, self.finish_reason)


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
             t_arrival: float) -> Outcome:  # fmt: skip
    """A sequence's end as its request's Outcome: ``finish`` (fed piece by piece when ``live``, else
    here with the whole text) closed, what it held back sent to ``on_steps`` first."""
    from localinfer.generate.finish import since

    st = result.stats
    ttft = None if st.first_token_s is None else result.t_admit + st.first_token_s - t_arrival
    reason = st.finish_reason
    if reason == "stop" and st.document == "incomplete":  # a stop string inside the document cut it
        reason = "length"  # never "stop" for a document that does not parse (clients trust it)
    if not live:
        finish.feed(result.text)
    tail = finish.close()
    if tail and on_steps is not None:
        on_steps(tail)  # what was held back (a marker's start, a call's end), before the outcome
    done = finish.result(reason, st)
    return Outcome(
        done.text, reason, st, queue_s=result.t_admit - t_arrival,
        ttft_s=since(done.t_text, t_arrival) if finish.splits else ttft, total_s=result.t_end - t_arrival,
        reasoning=done.reasoning, reasoning_tokens=done.reasoning_tokens,
        reasoning_ttft_s=since(done.t_reasoning, t_arrival), tool_calls=done.tool_calls,
    )  # fmt: skip


def failed(n_prompt: int, t_arrival: float, error: str | None, reason: str = "error") -> Outcome:
    """A request that ended without an answer: an error, or cancelled (``interrupted``) before it ran."""
    waited = time.perf_counter() - t_arrival
    stats = GenerationStats(prompt_tokens=n_prompt, finish_reason=reason)
    return Outcome("", reason, stats, queue_s=waited, ttft_s=None, total_s=waited, error=error)
