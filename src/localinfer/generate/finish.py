"""Finishing an answer, once for every surface: the model's raw text pieces in, typed steps out while
it streams (thinking, answer text, tool calls), then one ``Finished`` answer with its finish reason.

The engine (one sequence or a batch) only samples text; what that text means - a reasoning model's
thinking (``localinfer.request.reasoning``), calls to the offered tools (``localinfer.request.toolcalls``), why the
answer ended - is decided here, so ``run``, the API, batch and every wire protocol of ``serve`` see the
same answer. A protocol then only translates the steps and the ``Finished`` answer to its own shapes.
Plain Python, no llama_cpp, nothing about HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.request.toolcalls.events import CallArgs, CallStart, Text

if TYPE_CHECKING:
    from localinfer.request.reasoning import Splitter
    from localinfer.request.toolcalls.plan import ToolPlan
    from localinfer.request.toolcalls.spec import ToolCall

__all__ = ["CallArgs", "CallStart", "Finish", "Finished", "Step", "Text", "Thought"]


@dataclass(frozen=True)
class Thought:
    """A piece of a reasoning model's thinking (it comes before any answer text)."""

    text: str


# Text: a piece of the answer's content; CallStart / CallArgs: a tool call's index, id and name, then
# pieces of its arguments' JSON text as the model writes them (localinfer.request.toolcalls.parser's events).
Step = Text | Thought | CallStart | CallArgs


@dataclass(frozen=True)
class Finished:
    """One answer, finished: its content (thinking and calls taken out), its calls, and why it ended
    (``tool_calls`` when it ended by itself having made calls; otherwise the engine's reason)."""

    text: str
    finish_reason: str | None
    reasoning: str | None = None  # None: not a reasoning answer (no markers, or kept inline)
    reasoning_tokens: int | None = None  # of the completion tokens, the thinking's
    tool_calls: tuple[ToolCall, ...] = ()
    t_text: float | None = None  # time.perf_counter() of the first answer text (None: none, or not timed)
    t_reasoning: float | None = None  # time.perf_counter() of the first piece of thinking


def plain(splitter: Splitter | None, tools: ToolPlan | None) -> bool:
    """Whether an answer is all text as it comes (no thinking to split, no calls to parse): a stream
    may then hand on the raw pieces without making steps."""
    return splitter is None and (tools is None or not tools.offered)


class Finish:
    """Feed the answer's raw pieces as the engine samples them (``feed`` returns the steps to hand on
    now), ``close`` at the end (the steps held back), then ``result``. ``splitter``: a reasoning
    model's (None: no thinking to split); ``tools``: the request's plan (None: no calls to parse)."""

    __slots__ = ("_thinking", "_calls", "_pieces")

    def __init__(self, splitter: Splitter | None = None, tools: ToolPlan | None = None) -> None:
        from localinfer.request.reasoning import Thinking

        self._thinking = Thinking(splitter) if splitter is not None else None
        self._calls = tools.parser() if tools is not None else None  # None also when the tools are not offered
        self._pieces: list[str] = []  # the content, when no parser keeps it

    @property
    def splits(self) -> bool:
        """Whether thinking is split from the answer (and the first answer text is timed)."""
        return self._thinking is not None

    def feed(self, piece: str) -> list[Step]:
        if self._thinking is None:
            return self._content(piece) if piece else []
        reasoning, text = self._thinking.feed(piece)
        return self._steps(reasoning, text)

    def close(self) -> list[Step]:
        steps: list[Step] = []
        if self._thinking is not None:
            steps = self._steps(*self._thinking.finish())
        if self._calls is not None:
            steps.extend(self._calls.finish())
        return steps

    def result(self, finish_reason: str | None, stats: Any = None) -> Finished:
        """The answer (after ``close``); ``finish_reason``: why the engine stopped (stop | length...)."""
        calls = tuple(self._calls.calls) if self._calls is not None else ()
        text = self._calls.content if self._calls is not None else "".join(self._pieces)
        if calls:  # (the tool-call modules are imported only for an answer that made calls)
            from localinfer.request.toolcalls.plan import finish_reason as reason_with

            finish_reason = reason_with(calls, finish_reason)
        thinking = self._thinking
        if thinking is None:
            return Finished(text, finish_reason, tool_calls=calls)
        completion = getattr(stats, "completion_tokens", None)
        tokens = thinking.tokens if completion is None else min(thinking.tokens, completion)
        return Finished(text, finish_reason, thinking.split.reasoning or None, tokens, calls,
                        thinking.t_text, thinking.t_reasoning)  # fmt: skip

    def _steps(self, reasoning: str, text: str) -> list[Step]:
        steps: list[Step] = [Thought(reasoning)] if reasoning else []
        if text:
            steps += self._content(text)
        return steps

    def _content(self, text: str) -> list[Step]:
        steps: list[Step] = []
        if self._calls is not None:
            steps.extend(self._calls.feed(text))
            return steps
        self._pieces.append(text)
        steps.append(Text(text))
        return steps


def since(t: float | None, t0: float) -> float | None:
    """Seconds from ``t0`` to the clock time ``t`` (None stays None)."""
    return None if t is None else t - t0

