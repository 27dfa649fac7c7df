"""One answer, whoever gave it: the text, why it ended, its counts and timings, the model and the
backend; with one JSON shape for `run --json` and one for a batch output line (:class:`BatchResult`:
an answer, or the error of one input line). Its usage-history row: ``usage.recorder.record_of``.

Where the figures come from: the engine's ``GenerationStats`` (``stats``, an answer finished here or
by the resident server: ``of_finished``) or what a server reported (``received``, with ``--endpoint``). A figure nobody measured is None
(null in JSON, "unknown" on screen), never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localinfer.units import json_ms as _ms
from localinfer.units import json_number as _round

if TYPE_CHECKING:
    from localinfer.engine.types import GenerationStats
    from localinfer.answer.finished import Finished
    from localinfer.system.estimate import BufferReport
    from localinfer.system.preflight import LoadPlan
    from localinfer.request.toolcalls.spec import ToolCall


# What a server sent, as the client timed it (``remote.client``); here, so that the answer reads it
# without the answer's package depending on the client's.
@dataclass
class Received:
    """One answer as the client saw it (times from ``time.perf_counter()``)."""

    text: str = ""
    finish_reason: str | None = None
    model: str | None = None
    prompt_tokens: int | None = None  # from the server's usage; None: not reported
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    image_tokens: int | None = None  # usage.image_tokens (our serve's): of prompt_tokens
    server_timings: dict[str, Any] | None = None  # llama-server's (and our serve's) timings object
    t_start: float = 0.0  # the request was handed to the connection
    t_first: float | None = None  # first chunk with text
    t_last: float | None = None  # last chunk with text
    t_end: float = 0.0  # the stream ended
    itl: list[float] = field(default_factory=list)  # seconds between successive text chunks
    chunks: int = 0  # chunks carrying text
    reasoning: str = ""  # the thinking the server sent apart (delta.reasoning_content)
    reasoning_tokens: int | None = None  # usage.completion_tokens_details.reasoning_tokens
    logprobs: list[dict[str, Any]] | None = None  # what the server sent, in OpenAI's content shape
    whole: dict[str, Any] | None = None  # the answer whole (Finished.to_wire), where the server sends it (resident)

    @property
    def ttft_s(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_start

    @property
    def total_s(self) -> float:
        return self.t_end - self.t_start

    @property
    def decode_s(self) -> float | None:
        """First text chunk to the last: what the tokens after the first took."""
        if self.t_first is None or self.t_last is None:
            return None
        return self.t_last - self.t_first

    @property
    def decode_tps(self) -> float | None:
        """Tokens after the first (the server's count) over the client's decode time."""
        n, d = self.completion_tokens, self.decode_s
        if n is None or n < 2 or not d or d <= 0:
            return None
        return (n - 1) / d


def _timing(timings: dict[str, Any] | None, key: str) -> float | None:
    value = (timings or {}).get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class _Either:
    """A figure read from the engine's stats (an answer made here), else from what a server sent."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __get__(self, answer: Answer | None, owner: type) -> Any:
        if answer is None:
            return self
        source = answer.stats if answer.stats is not None else answer.received
        return None if source is None else getattr(source, self.key)


@dataclass
class Answer:
    """What one request produced and measured (see docs/metrics.md)."""

    text: str
    model: str
    stats: GenerationStats | None = None  # the engine's figures: an answer made here
    load_s: float | None = None  # None: nothing was loaded for it (a server's answer)
    ttft_s: float | None = None
    total_s: float = 0.0
    peak_rss: int = 0
    mode: str = "chat"  # chat | raw
    warnings: list[str] = field(default_factory=list)
    plan: LoadPlan | None = None  # how the model was loaded (context source, GPU layers, estimate)
    buffers: BufferReport | None = None  # llama.cpp's reported buffer sizes
    received: Received | None = None  # what a server sent and the client timed (``--endpoint``)
    backend: str | None = None  # the server that answered (Endpoint.display, no credentials); None: here
    sampling_seed: int | None = None  # the seed asked of a server (the engine reports its own)
    resident: bool = False  # answered by this user's resident server (--keep-alive): nothing loaded for it
    reasoning: str | None = None  # a reasoning model's thinking, apart from ``text`` (localinfer.request.reasoning)
    reasoning_tokens: int | None = None  # of completion_tokens, the thinking's; None: not split or not reported
    reasoning_ttft_s: float | None = None  # to the first piece of thinking (ttft_s: to the first answer text)
    tool_calls: list[ToolCall] | None = None  # the calls the model made (``text`` is then the rest)
    # asked for (Request.logprobs): one entry per answer token, in OpenAI's content shape
    # {"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}...]}
    logprobs: list[dict[str, Any]] | None = None
    # how the model was loaded, as ``load_facts`` wrote it: an answer the resident server finished
    # (``plan`` and ``buffers`` stay in the process that loaded the model)
    facts: dict[str, Any] | None = None

    @classmethod
    def of_finished(cls, done: Finished, model: str, **where: Any) -> Answer:
        """The answer to a request finished by the engine (``generate.finish``: here, or in the
        resident server, which sends that record whole); ``where``: what the entry adds (the load,
        the mode, the plan...) or times itself (the resident client: TTFT as the user saw it)."""
        fields = {"ttft_s": done.ttft_s, "total_s": done.total_s, "reasoning": done.reasoning,
                  "reasoning_tokens": done.reasoning_tokens, "reasoning_ttft_s": done.reasoning_ttft_s,
                  "tool_calls": list(done.tool_calls) or None, "logprobs": done.logprobs}  # fmt: skip
        return cls(done.text, model, done.stats, **{**fields, **where})

    @classmethod
    def of_received(cls, got: Received, model: str, backend: str | None, mode: str = "chat", seed: int | None = None) -> Answer:
        """The answer a server sent (``--endpoint``), with its figures as reported."""
        return cls(got.text, model, ttft_s=got.ttft_s, total_s=got.total_s, mode=mode, received=got, backend=backend,
                   sampling_seed=seed, reasoning=got.reasoning or None, reasoning_tokens=got.reasoning_tokens,
                   logprobs=got.logprobs)  # fmt: skip

    # -- the figures, wherever they came from ------------------------------------------------------
    finish_reason = _Either("finish_reason")
    prompt_tokens = _Either("prompt_tokens")
    cached_tokens = _Either("cached_tokens")
    image_tokens = _Either("image_tokens")  # of prompt_tokens
    completion_tokens = _Either("completion_tokens")
    decode_s = _Either("decode_s")  # from the first token to the last (on a server: as the client saw it)
    decode_tps = _Either("decode_tps")  # tokens after the first over decode_s

    def interrupted(self) -> None:
        """Mark the answer as cut short by Ctrl-C."""
        if self.stats is not None:
            self.stats.finish_reason = "interrupted"
        if self.received is not None:
            self.received.finish_reason = "interrupted"

    @property
    def prompt_eval_tokens(self) -> int | None:
        """Prompt tokens evaluated now (not cached): the engine's count, or llama-server's ``timings.prompt_n``."""
        if self.stats is not None:
            return self.stats.evaluated_tokens
        n = _timing(self.server_timings, "prompt_n")
        return None if n is None else int(n)

    @property
    def total_tokens(self) -> int | None:
        p, c = self.prompt_tokens, self.completion_tokens
        return None if p is None or c is None else p + c

    @property
    def truncated_tokens(self) -> int | None:
        return self.stats.truncated_tokens if self.stats is not None else None

    @property
    def prefill_s(self) -> float | None:
        if self.stats is not None:
            return self.stats.prefill_s
        ms = _timing(self.server_timings, "prompt_ms")
        return None if ms is None else ms / 1000.0

    @property
    def prefill_tps(self) -> float | None:
        if self.stats is not None:
            return self.stats.prefill_tps
        n, s = self.prompt_eval_tokens, self.prefill_s
        return n / s if n and s else None

    @property
    def seed(self) -> int | None:
        return self.stats.extra.get("seed") if self.stats is not None else self.sampling_seed

    @property
    def draft_tokens(self) -> int | None:
        """Tokens speculative decoding drafted (None: it was off, or a server's answer)."""
        return self.stats.draft_tokens if self.stats is not None and self.stats.draft else None

    @property
    def draft_accepted(self) -> int | None:
        """Of ``draft_tokens``, those the model kept."""
        return self.stats.draft_accepted if self.stats is not None and self.stats.draft else None

    @property
    def server_timings(self) -> dict[str, Any] | None:
        return self.received.server_timings if self.received is not None else None

    @property
    def gpu_layers(self) -> int | None:
        """Layers llama.cpp offloaded to a GPU (what it reported; 0 on a CPU-only build)."""
        return (self.load_facts() or {}).get("gpu_layers")

    # -- the library API's names (``localinfer.api``: Chunk.stats, Response.stats) ------------------
    @property
    def ttft_ms(self) -> float | None:
        return None if self.ttft_s is None else self.ttft_s * 1000

    @property
    def load_ms(self) -> float | None:
        return self.load_s * 1000 if self.load_s else None

    @property
    def total_ms(self) -> float:
        return self.total_s * 1000

    @property
    def prefill_tokens_per_s(self) -> float | None:
        return self.prefill_tps

    @property
    def decode_tokens_per_s(self) -> float | None:
        return self.decode_tps

    def load_facts(self) -> dict[str, Any] | None:
        """How the model was loaded, as JSON: from the plan and llama.cpp's report, or as received."""
        if self.plan is None and self.buffers is None:
            return self.facts
        return load_facts(self.plan, self.buffers)

    # -- the JSON shapes -------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """``run --json``'s object: the same keys here and from a server (null where unknown); an answer
        made here adds how the model was loaded, a server's its endpoint and its own timings."""
        out: dict[str, Any] = {"model": self.model}
        if self.backend is not None:
            out["endpoint"] = self.backend
        out.update({
            "text": self.text,
            "reasoning": self.reasoning,
            "finish_reason": self.finish_reason,
            **self._calls_json(),
            "mode": self.mode,
            "usage": {
                "prompt_tokens": self.prompt_tokens,
                "prompt_eval_tokens": self.prompt_eval_tokens,
                "cached_tokens": self.cached_tokens,
                "completion_tokens": self.completion_tokens,
                "reasoning_tokens": self.reasoning_tokens,
                "total_tokens": self.total_tokens,
                "truncated_prompt_tokens": self.truncated_tokens,
                "image_tokens": self.image_tokens,
            },
            "timings": {
                "load_ms": _ms(self.load_s),
                "ttft_ms": _ms(self.ttft_s),
                "reasoning_ttft_ms": _ms(self.reasoning_ttft_s),
                "prefill_ms": _ms(self.prefill_s),
                "prefill_tokens_per_s": _round(self.prefill_tps),
                "image_encode_ms": _ms(self.stats.image_encode_s) if self.stats is not None else None,
                "decode_ms": _ms(self.decode_s),
                "decode_tokens_per_s": _round(self.decode_tps),
                "total_ms": _ms(self.total_s),
                "draft_tokens": self.draft_tokens,
                "draft_accepted_tokens": self.draft_accepted,
            },
        })  # fmt: skip
        if self.stats is not None:
            out.update(self._load_json(self.stats))
        else:
            out["server_timings"] = self.server_timings
        out["seed"] = self.seed
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs
        return out

    def _calls_json(self) -> dict[str, Any]:
        """``tool_calls`` (OpenAI's shape), only in an answer to a request with tools that made calls."""
        return {"tool_calls": [c.to_openai() for c in self.tool_calls]} if self.tool_calls else {}

    def _load_json(self, s: GenerationStats) -> dict[str, Any]:
        f = self.load_facts() or {}
        return {
            "context": {"n_ctx": s.n_ctx, "used": s.context_used, "n_ctx_train": f.get("n_ctx_train"), "source": f.get("source")},
            "offload": {k: f.get(k, {} if k == "devices" else None) for k in ("gpu_layers", "layers", "gpu_offload_supported", "devices")},
            "memory": {"peak_rss_bytes": self.peak_rss, "estimate": f.get("estimate"), "llama_cpp": f.get("llama_cpp")},
        }

    def batch_json(self, rid: Any) -> dict[str, Any]:
        """A batch output line (the same keys here and from a server): ``to_json``'s, fewer of them."""
        full = self.to_json()
        out = {"id": rid, "text": self.text, "reasoning": self.reasoning, "finish_reason": full["finish_reason"],
               **self._calls_json(), "usage": {k: full["usage"][k] for k in _BATCH_USAGE},
               "timings": {k: full["timings"][k] for k in _BATCH_TIMINGS}, "seed": full["seed"]}  # fmt: skip
        if self.draft_tokens is not None:  # --draft: what each line's sequence drafted and kept
            out["timings"].update(draft_tokens=self.draft_tokens, draft_accepted_tokens=self.draft_accepted)
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs
        return out


_BATCH_USAGE = ("prompt_tokens", "completion_tokens", "reasoning_tokens", "total_tokens", "truncated_prompt_tokens")
_BATCH_TIMINGS = ("ttft_ms", "reasoning_ttft_ms", "prefill_ms", "decode_ms", "decode_tokens_per_s", "total_ms")

def load_facts(plan: LoadPlan | None, buffers: BufferReport | None) -> dict[str, Any]:
    """How a model was loaded (``--json``'s context, offload and memory figures), as JSON."""
    gpu_layers = None
    if buffers is not None and buffers.offloaded is not None:
        gpu_layers = buffers.offloaded
    elif plan is not None:
        gpu_layers = plan.n_gpu_layers if plan.budget.gpu_offload else 0
    return {
        "n_ctx_train": plan.n_ctx_train if plan else None,
        "source": plan.ctx_source if plan else None,
        "gpu_layers": gpu_layers,
        "layers": plan.n_offloadable if plan else None,
        "gpu_offload_supported": plan.budget.gpu_offload if plan else None,
        "devices": buffers.by_device("model") if buffers else {},
        "estimate": plan.estimate.to_json() if plan and plan.estimate else None,
        "llama_cpp": buffers.to_json() if buffers and buffers.buffers else None,
    }


@dataclass
class BatchResult:
    """One request's outcome: an answer, or an error saying which input line and why."""

    index: int  # position in the items given to run_batch
    id: Any
    line: int
    answer: Answer | None = None
    error: str | None = None
    exc: BaseException | None = None  # the error as an exception (for --on-error abort)

    @property
    def text(self) -> str:
        return self.answer.text if self.answer is not None else ""

    @property
    def stats(self) -> GenerationStats | None:
        return self.answer.stats if self.answer is not None else None

    @property
    def finish_reason(self) -> str | None:
        return self.answer.finish_reason if self.answer is not None else None

    @property
    def fatal(self) -> bool:
        """A failure every request would meet (a refused key): the job stops at once."""
        return bool(getattr(self.exc, "fatal", False))

    def to_json(self) -> dict[str, Any]:
        if self.answer is None:
            return {"id": self.id, "line": self.line, "error": self.error}
        return self.answer.batch_json(self.id)
