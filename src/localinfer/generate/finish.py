"""Finishing an answer, once for every surface: the model's raw text pieces in, typed steps out while
it streams (thinking, answer text, tool calls), then one ``Finished`` answer with its finish reason.

The engine (one sequence or a batch) only samples text; what that text means - a reasoning model's
thinking (``localinfer.request.reasoning``), calls to the offered tools (``localinfer.request.toolcalls``), why the
answer ended - is decided here, so ``run``, the API, batch and every wire protocol of ``serve`` see the
same answer. A protocol then only translates the steps and the ``Finished`` answer to its own shapes.
Plain Python, no llama_cpp, nothing about HTTP.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.answer.finished import Finished, answer_logprobs, reason_of
from localinfer.request.toolcalls.events import CallArgs, CallStart, Text

if TYPE_CHECKING:
    from localinfer.engine.batch import SeqResult
    from localinfer.request.reasoning import Splitter
    from localinfer.request.toolcalls.plan import ToolPlan

__all__ = ["CallArgs", "CallStart", "Finish", "Finished", "Step", "Text", "Thought", "reason_of"]


@dataclass(frozen=True)
class Thought:
    """A piece of a reasoning model's thinking (it comes before any answer text)."""

    text: str


# Text: a piece of the answer's content; CallStart / CallArgs: a tool call's index, id and name, then
# pieces of its arguments' JSON text as the model writes them (localinfer.request.toolcalls.parser's events).
Step = Text | Thought | CallStart | CallArgs


def plain(splitter: Splitter | None, tools: ToolPlan | None) -> bool:
    """Whether an answer is all text as it comes (no thinking to split, no calls to parse): a stream
    may then hand on the raw pieces without making steps."""
    return splitter is None and (tools is None or not tools.offered)


class Finish:
    """Feed the answer's raw pieces as the engine samples them (``feed`` returns the steps to hand on
    now, timed as they come) or its whole text at the end (``fill``: not timed), ``close`` at the end
    (the steps held back), then ``result``: the one assembly of a finished answer. ``splitter``: a
    reasoning model's (None: no thinking to split); ``tools``: the request's plan (None: no calls)."""

    __slots__ = ("_thinking", "_calls", "_pieces", "_raw", "_timed", "t_text", "t_reasoning")

    def __init__(self, splitter: Splitter | None = None, tools: ToolPlan | None = None) -> None:
        from localinfer.request.reasoning import Thinking

        self._thinking = Thinking(splitter) if splitter is not None else None
        self._calls = tools.parser() if tools is not None else None  # None also when the tools are not offered
        self._pieces: list[str] = []  # the content, when no parser keeps it
        self._raw: list[str] = []  # every piece fed (what the logprobs' tokens spell)
        self._timed = True  # fed piece by piece (``fill``: the whole text at the end)
        self.t_text: float | None = None  # time.perf_counter() of the first answer text
        self.t_reasoning: float | None = None  # of the first piece of thinking

    @property
    def splits(self) -> bool:
        """Whether thinking is split from the answer (and counted piece by piece)."""
        return self._thinking is not None

    def feed(self, piece: str) -> list[Step]:
        self._raw.append(piece)
        if self._thinking is None:
            return self._content(piece) if piece else []
        reasoning, text = self._thinking.feed(piece)
        return self._steps(reasoning, text)

    def fill(self, text: str) -> list[Step]:
        """The whole text at once, after the engine ended (TTFT is then the engine's first token)."""
        self._timed = False
        return self.feed(text)

    def close(self) -> list[Step]:
        steps: list[Step] = []
        if self._thinking is not None:
            steps = self._steps(*self._thinking.finish())
        if self._calls is not None:
            steps.extend(self._calls.finish())
        return steps

    def result(self, finish_reason: str | None = None, stats: Any = None, *, t0: float | None = None,
               t_end: float | None = None, t_first: float | None = None, taken: tuple[str, str | None] | None = None,
               ) -> Finished:  # fmt: skip
        """The answer (after ``close``). ``finish_reason``: why the engine stopped (default: ``stats``'s),
        made the answer's once (``reason_of``), and written back to ``stats``. ``t0``: the
        request's arrival at its entry (clock); ``t_end``: its end; ``t_first``: the engine's first token
        (clock), TTFT where the text was ``fill``ed. ``taken``: the text and thinking a consumer that
        stopped early took (what it shows is what the answer is)."""
        calls = tuple(self._calls.calls) if self._calls is not None else ()
        text = self._calls.content if self._calls is not None else "".join(self._pieces)
        engine = finish_reason if finish_reason is not None else getattr(stats, "finish_reason", None)
        reason = reason_of(engine, stats, calls)
        if stats is not None:
            stats.finish_reason = reason
        thinking, reasoning, tokens = self._thinking, None, None
        if thinking is not None:
            reasoning = thinking.split.reasoning or None
            completion = getattr(stats, "completion_tokens", None)
            tokens = thinking.tokens if completion is None else min(thinking.tokens, completion)
        if taken is not None:
            text, reasoning = taken[0], (taken[1] if thinking is not None else None)
        t_text = self.t_text if self._timed else (t_first if text else None)
        entries = getattr(stats, "logprobs", None)
        logprobs = answer_logprobs(entries, "".join(self._raw), text, thinking is not None)
        return Finished(text, reason, stats, since(t_text, t0), since(t_end, t0) or 0.0, reasoning, tokens,
                        since(self.t_reasoning if self._timed else None, t0), calls, logprobs,
                        t_text, self.t_reasoning)  # fmt: skip

    def of_sequence(self, res: SeqResult, t0: float) -> Finished:
        """``result`` for a sequence the batch engine decoded (after ``close``), which arrived at ``t0``."""
        st = res.stats
        t_first = None if st.first_token_s is None else res.t_admit + st.first_token_s
        return self.result(stats=st, t0=t0, t_end=res.t_end, t_first=t_first)

    def _steps(self, reasoning: str, text: str) -> list[Step]:
        steps: list[Step] = []
        if reasoning:
            self.t_reasoning = self.t_reasoning or time.perf_counter()
            steps.append(Thought(reasoning))
        if text:
            steps += self._content(text)
        return steps

    def _content(self, text: str) -> list[Step]:
        if self._calls is not None:
            steps = self._calls.feed(text)
        else:
            self._pieces.append(text)
            steps = [Text(text)]
        if self.t_text is None and any(isinstance(s, Text) and s.text for s in steps):
            self.t_text = time.perf_counter()
        return steps


def since(t: float | None, t0: float | None) -> float | None:
    """Seconds from ``t0`` to the clock time ``t`` (None stays None; no ``t0``: not timed)."""
    return None if t is None or t0 is None else t - t0

