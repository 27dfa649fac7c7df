"""The one record of a finished answer (``Finished``), whoever finished it: ``generate.finish.Finish``
assembles it for ``run``, the API, batch and every wire of ``serve``; the resident server sends it
whole (``to_wire``) and its client reads it back (``from_wire``); ``answer.Answer.of_finished`` makes the
answer a command shows of it. Here too: the one rule for why an answer ended (``reason_of``) and
the one policy for its logprobs (``answer_logprobs``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localinfer.request.toolcalls.spec import ToolCall


@dataclass(frozen=True)
class Finished:
    """One answer, finished: the one record every entry makes of it (``run``, the API, batch, each wire
    of ``serve``, the resident server, which sends it whole: ``to_wire``). Its content (thinking and
    calls taken out), its calls, why it ended (decided once: ``reason_of``), its logprobs (those of
    the answer text: ``answer_logprobs``) and its times, in seconds from the request's arrival at the
    entry that measured it (docs/metrics.md)."""

    text: str
    finish_reason: str | None
    stats: Any = None  # the engine's GenerationStats, when given (its finish_reason is this one's)
    ttft_s: float | None = None  # to the first answer text (thinking and calls are not)
    total_s: float = 0.0
    reasoning: str | None = None  # None: not a reasoning answer (no markers, or kept inline)
    reasoning_tokens: int | None = None  # of the completion tokens, the thinking's
    reasoning_ttft_s: float | None = None  # to the first piece of thinking
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: list[dict[str, Any]] | None = None  # asked for: one entry per token of ``text``
    t_text: float | None = None  # time.perf_counter() of the first answer text (None: none, or not timed)
    t_reasoning: float | None = None  # time.perf_counter() of the first piece of thinking

    def to_wire(self) -> dict[str, Any]:
        """The record as JSON (``from_wire`` is its inverse): the stats whole (their logprobs once, as
        the answer's), the calls in OpenAI's shape; the clock stamps stay in the process that took them."""
        out = {f: getattr(self, f) for f in _PLAIN}
        out["stats"] = None if self.stats is None else {**self.stats.to_wire(), "logprobs": None}
        out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return out

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Finished:
        from localinfer.engine.types import GenerationStats
        from localinfer.request.toolcalls.spec import ToolCall

        stats = GenerationStats.from_wire(data["stats"]) if isinstance(data.get("stats"), dict) else None
        calls = tuple(ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in data.get("tool_calls") or ())
        return cls(**{f: data[f] for f in _PLAIN if f in data}, stats=stats, tool_calls=calls)


_PLAIN = ("text", "finish_reason", "ttft_s", "total_s", "reasoning", "reasoning_tokens", "reasoning_ttft_s", "logprobs")


def reason_of(engine: str | None, stats: Any = None, calls: tuple[ToolCall, ...] = ()) -> str | None:
    """Why an answer ended, decided once for every entry and wire: the engine's reason (stop | length |
    interrupted...), except ``length`` for a constrained document a stop string cut (it does not
    parse: a client trusts ``stop``), and ``tool_calls`` for an answer that ended by itself with calls."""
    reason = engine
    if reason == "stop" and getattr(stats, "document", None) == "incomplete":
        reason = "length"
    if calls:  # (the tool-call modules are imported only for an answer that made calls)
        from localinfer.request.toolcalls.plan import finish_reason as reason_with

        reason = reason_with(calls, reason)
    return reason


def answer_logprobs(entries: list[dict[str, Any]] | None, raw: str, text: str, after_thinking: bool) -> list[dict[str, Any]] | None:
    """The logprobs of the answer's text: the entries of the tokens whose bytes begin inside it, where
    it lies in ``raw`` (what the engine sampled, a stop string cut): neither the thinking before it
    nor a stop string's tokens after it (llama-server drops those too)."""
    if entries is None:
        return None
    at = raw.rfind(text) if after_thinking else raw.find(text)
    at = max(at, 0)
    start = len(raw[:at].encode("utf-8", errors="surrogatepass"))
    end = start + len(text.encode("utf-8", errors="surrogatepass"))
    out, pos = [], 0
    for e in entries:
        if pos >= end:
            break
        if pos >= start:
            out.append(e)
        pos += len(e["bytes"])
    return out
