"""OpenAI's Chat Completions (and completions) answer shapes: a whole completion, or SSE chunks that
all carry the same ``id`` and ``created``; with llama-server's ``timings`` object and
``usage.prompt_tokens_details.cached_tokens``. A translator only: the engine's finished answer and its
steps (``localinfer.generate.finish``) in, OpenAI's shapes out."""

from __future__ import annotations

import functools
import json
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.answer.finite import dumps as finite_dumps  # NaN/Infinity as null: JSON has neither
from localinfer.serve.scheduler.worker import Ended
from localinfer.serve.wires.writer import WriterDefaults

if TYPE_CHECKING:
    from localinfer.generate.finish import Step

_PIECE = "\x00piece\x00"  # stands for the text in a chunk template
DONE = b"data: [DONE]\n\n"


def dumps(obj: Any) -> str:
    return finite_dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sse(obj: Any) -> bytes:
    return f"data: {dumps(obj)}\n\n".encode()


def usage(outcome: Ended) -> dict[str, Any]:
    s = outcome.stats
    out: dict[str, Any] = {
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.prompt_tokens + s.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": s.cached_tokens},
    }
    if s.image_tokens:  # of prompt_tokens (engine.vision)
        out["image_tokens"] = s.image_tokens
    if outcome.reasoning_tokens is not None:  # OpenAI's name for the thinking's share
        out["completion_tokens_details"] = {"reasoning_tokens": outcome.reasoning_tokens}
    return out


def timings(outcome: Ended) -> dict[str, Any]:
    """llama-server's ``timings``: prompt_* counts the evaluated prompt tokens (``cache_n`` were
    reused), predicted_* the answer (its rate over the tokens after the first, docs/metrics.md)."""
    s = outcome.stats
    prompt_ms, predicted_ms = s.prefill_s * 1000.0, s.decode_s * 1000.0
    n_prompt = s.evaluated_tokens
    return {
        "cache_n": s.cached_tokens,
        "prompt_n": n_prompt,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / n_prompt, 3) if n_prompt else None,
        "prompt_per_second": round(s.prefill_tps, 3) if s.prefill_tps else None,
        "predicted_n": s.completion_tokens,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / (s.completion_tokens - 1), 3) if s.completion_tokens > 1 else None,
        "predicted_per_second": round(s.decode_tps, 3) if s.decode_tps else None,
        "queue_ms": round(outcome.queue_s * 1000.0, 3),
        "ttft_ms": None if outcome.ttft_s is None else round(outcome.ttft_s * 1000.0, 3),
        **({} if outcome.reasoning_tokens is None else {"reasoning_ttft_ms": _ms(outcome.reasoning_ttft_s)}),
        **({"draft_n": s.draft_tokens, "draft_n_accepted": s.draft_accepted} if s.draft else {}),  # --draft
        **({"image_encode_ms": _ms(s.image_encode_s)} if s.image_tokens else {}),  # apart from prompt_ms
    }


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1000.0, 3)


def legacy_logprobs(entries: list[dict[str, Any]], offset: int = 0) -> dict[str, Any]:
    """The completions API's shape of content entries; ``text_offset``: each token's first character
    in the answer, counted from ``offset`` (what earlier chunks of a stream held)."""
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e["token"])
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }


@dataclass(frozen=True)
class CompletionWriter(WriterDefaults):
    """What every chunk of one answer shares."""

    kind: str  # chat | text
    model: str
    include_usage: bool = False
    id: str = ""
    created: int = 0
    whole_answers: bool = False  # the resident server's (catalog.WHOLE): the last chunk adds ``localinfer``, the record whole
    return_progress: bool = False  # llama-server's: ``prompt_progress`` chunks while the prompt is read

    @classmethod
    def new(cls, kind: str, model: str, include_usage: bool = False, whole_answers: bool = False,
            return_progress: bool = False) -> CompletionWriter:  # fmt: skip
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        return cls(kind, model, include_usage, prefix + secrets.token_hex(12), int(time.time()), whole_answers, return_progress)

    def _head(self, chunk: bool) -> dict[str, Any]:
        if self.kind == "chat":
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def logprobs(self, entries: list[dict[str, Any]] | None, offset: int = 0) -> dict[str, Any] | None:
        """A choice's ``logprobs``: chat's ``{"content": [...]}``, or the completions API's legacy shape."""
        if entries is None:
            return None
        return {"content": entries} if self.kind == "chat" else legacy_logprobs(entries, offset)

    def _choice(self, text: str | None, finish_reason: str | None, *, role: bool = False, logprobs: Any = None) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": text or ""} if role else ({} if text is None else {"content": text})
            return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return {"text": text or "", "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}

    def chunk(self, text: str | None, finish_reason: str | None = None, *, role: bool = False, logprobs: Any = None,
              **extra: Any) -> bytes:  # fmt: skip
        body = {**self._head(True), "choices": [self._choice(text, finish_reason, role=role, logprobs=logprobs)], **extra}
        if self.include_usage:
            body.setdefault("usage", None)  # OpenAI's chunks say so until the last one
        return sse(body)

    def reasoning_chunk(self, text: str) -> bytes:
        """Thinking, streamed apart: ``delta.reasoning_content`` (llama-server's, DeepSeek's) and
        ``delta.reasoning`` (Ollama's, newer vLLM's), the same text under both names."""
        delta = {"reasoning_content": text, "reasoning": text}
        body = {**self._head(True), "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}
        if self.include_usage:
            body["usage"] = None
        return sse(body)

    # -- what app.AnswerResponse asks of a protocol's writer -----------------------------------------------
    def head(self, mode: str) -> bytes:
        """A stream's first chunk: OpenAI's names the role (chat only)."""
        return self.chunk("", role=True) if self.kind == "chat" else b""

    def progress(self, total: int, cached: int, evaluated: int, seconds: float) -> bytes:
        """Where asked (``return_progress``), llama-server's progress chunk: an empty assistant delta
        with ``prompt_progress`` (its tokens, the cached ones, those evaluated so far, cached included)."""
        if not self.return_progress:
            return b""
        choice = self._choice(None, None, role=True) if self.kind == "chat" else self._choice("", None)
        if self.kind == "chat":
            choice["delta"]["content"] = None
        body = {**self._head(True), "choices": [choice],
                "prompt_progress": {"total": total, "cache": cached, "processed": evaluated, "time_ms": round(seconds * 1000)}}  # fmt: skip
        if self.include_usage:
            body["usage"] = None
        return sse(body)

    def text_piece(self, encoded: bytes) -> bytes:
        """A text chunk for a piece already a JSON string (the fast path: the chunk is made once)."""
        before, after = self._spliced
        return before + encoded + after

    @functools.cached_property
    def _spliced(self) -> tuple[bytes, bytes]:
        return self.text_chunks()

    def steps(self, steps: list[Step]) -> bytes:
        return self.event_chunks(steps)

    def logprobs_piece(self, text: str, entries: list[dict[str, Any]], offset: int) -> bytes:
        """A piece with its tokens' logprobs (``offset``: the characters sent before it)."""
        return self.chunk(text, logprobs=self.logprobs(entries, offset)) if text or entries else b""

    def tail(self, outcome: Ended) -> bytes:
        return self.last_chunks(outcome)

    def stream_error(self, exc: Any) -> bytes:
        """An error after the headers went out: an SSE event with the error object, then [DONE]."""
        return sse(exc.body()) + DONE

    def text_chunks(self) -> tuple[bytes, bytes]:
        """The bytes around a piece's JSON string in a text chunk: json.dumps once per answer, not per token."""
        raw = self.chunk(_PIECE).decode()
        before, after = raw.split(json.dumps(_PIECE, ensure_ascii=False), 1)
        return before.encode(), after.encode()

    def event_chunks(self, events: list[Step]) -> bytes:
        """An answer's steps as chunks: thinking (``reasoning_chunk``), content (a run of text pieces in
        one chunk), or OpenAI's ``delta.tool_calls`` keyed by ``index`` (the id and name in a call's
        first delta, then its arguments in pieces)."""
        from localinfer.generate.finish import CallStart, Text, Thought

        out: list[bytes] = []
        run: list[str] = []  # a run of text or thinking pieces, sent as one chunk
        kind: type | None = None
        for e in [*events, None]:
            if run and type(e) is not kind:
                joined = "".join(run)
                out.append(self.chunk(joined) if kind is Text else self.reasoning_chunk(joined))
                run = []
            if isinstance(e, (Text, Thought)):
                run.append(e.text)
                kind = type(e)
                continue
            if e is None:
                break
            if isinstance(e, CallStart):
                call = {"index": e.index, "id": e.id, "type": "function", "function": {"name": e.name, "arguments": ""}}
            else:
                call = {"index": e.index, "function": {"arguments": e.text}}
            body = {**self._head(True), "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "logprobs": None, "finish_reason": None}]}
            out.append(sse({**body, "usage": None} if self.include_usage else body))
        return b"".join(out)

    def last_chunks(self, outcome: Ended) -> bytes:
        """The finish reason (and timings), then usage in a chunk of its own if asked, then [DONE]."""
        out = self.chunk(None, outcome.finish_reason, timings=timings(outcome))
        if self.include_usage:
            more = {"localinfer": outcome.to_wire()} if self.whole_answers else {}  # the record, whole
            out += sse({**self._head(True), "choices": [], "usage": usage(outcome), "timings": timings(outcome), **more})
        return out + DONE

    def whole(self, outcome: Ended) -> dict[str, Any]:
        logprobs = self.logprobs(outcome.logprobs)
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": outcome.text}
            if outcome.reasoning is not None:
                message.update(reasoning_content=outcome.reasoning, reasoning=outcome.reasoning)
            calls = outcome.tool_calls
            if calls:
                message["content"] = outcome.text if outcome.text.strip() else None  # OpenAI: null when only calls
                message["tool_calls"] = [c.to_openai() for c in calls]
            choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": outcome.finish_reason}
        else:
            choice = {"text": outcome.text, "index": 0, "logprobs": logprobs, "finish_reason": outcome.finish_reason}
        return {**self._head(False), "choices": [choice], "usage": usage(outcome), "timings": timings(outcome)}
