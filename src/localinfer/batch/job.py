"""The core of `localinfer batch`: many requests through one model, several sequences at a time.

Core API (plain values; `bench --parallel` uses it too)::

    from localinfer.generate import loading
    from localinfer.batch import job as batchjob
    from localinfer.engine.batch import BatchStats

    items = batchjob.parse_input(text, fmt="auto")          # -> [BatchRequest | InputError, ...]
    #   or build them: batchjob.BatchRequest(id="a", line=1, prompt="Hi", max_tokens=64, ignore_eos=True)
    opts = batchjob.batch_load_options(load_opts, parallel=8, ctx_per_seq=512)
    loaded = loading.load(resolved, opts)                 # one context, 8 sequences of 512 tokens
    stats = BatchStats()                                    # optional: aggregate figures (S_TG-like)
    for result in batchjob.run_batch(items, loaded, parallel=8, defaults=batchjob.BatchDefaults(), stats=stats):
        result.to_json()                                    # id, text, finish_reason, usage, timings | error
    stats.decode_tps                                        # aggregate decode tok/s over decode-only steps

``run_batch`` yields one :class:`BatchResult` per item, in completion order (``result.index`` is the
item's position), errors included (``result.error``; never raised, except for model-wide failures).
:func:`execute` adds what the command needs around it: output order, the error policy, progress and
the summary, for any backend (the engine here, or a server with ``--endpoint``). Input parsing and resumable output live in :mod:`localinfer.batch.io`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localinfer.answer.answer import BatchResult
from localinfer.batch.io import BatchRequest, InputError, OutputOrder, id_key, parse_input  # noqa: F401 - re-exported API
from localinfer.engine.types import LoadOptions
from localinfer.request.sampling import SamplingOptions
from localinfer.errors import UsageError

if TYPE_CHECKING:
    from localinfer.backends import Backend
    from localinfer.engine.batch import BatchStats
    from localinfer.generate.loading import LoadedModel
    from localinfer.request.request import Request
    from localinfer.store import ResolvedModel

Warn = Callable[[str], None]


@dataclass(frozen=True)
class BatchDefaults:
    """What a request gets when its line does not say (the command's flags)."""

    sampling: SamplingOptions = SamplingOptions()
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    system: str | None = None  # for prompt requests; messages are used as given
    raw: bool = False  # prompt requests as plain completion, even when the model has a template
    on_overflow: str = "error"  # error | truncate
    response_format: Any = None  # a structured.Format for every line that names none (--json-schema...)
    template_vars: dict | None = None  # the chat template's variables (--chat-template-kwargs)
    logprobs: int | None = None  # the top N of each token's log probabilities (None: off)


def to_request(item: BatchRequest, defaults: BatchDefaults, backend: Backend) -> Request:
    """The request a batch line makes, with the command's defaults where the line is silent."""
    from localinfer.request import request as rq

    sampling = item.sampling_over(defaults.sampling)
    fmt = defaults.response_format if item.response_format is None else item.response_format or None
    if item.messages is not None and not backend.can_chat:
        raise UsageError(f"{backend.name} has no chat template, so it cannot take 'messages' (use 'prompt')")
    return rq.build(
        item.prompt, messages=item.messages, system=defaults.system, raw=defaults.raw or not backend.can_chat,
        max_tokens=item.max_tokens if item.max_tokens is not None else defaults.max_tokens,
        stop=item.stop if item.stop is not None else defaults.stop,
        sampling=sampling, on_overflow=defaults.on_overflow, ignore_eos=item.ignore_eos, response_format=fmt,
        chat_template_kwargs=defaults.template_vars,
        tools=item.tools, tool_choice=item.tool_choice, parallel_tool_calls=item.parallel_tool_calls,
        logprobs=item.logprobs if item.logprobs is not None else defaults.logprobs,
    )  # fmt: skip


def check_template(loaded: LoadedModel) -> None:
    """Render a trivial chat once: a template the sandbox refuses fails the whole job, up front.

    (A template that merely dislikes some conversation fails those requests alone, later.)
    """
    from localinfer.engine.templates import TemplateRefusedError

    if loaded.template is None:
        return
    try:
        loaded.template.render([{"role": "user", "content": "hi"}])
    except TemplateRefusedError as exc:
        if "refused by the sandbox" in str(exc):
            raise
    except UsageError:  # the template rejects this conversation (raise_exception)
        pass


def run_batch(
    items: Sequence[BatchRequest | InputError],
    loaded: LoadedModel,
    parallel: int,
    defaults: BatchDefaults = BatchDefaults(),
    *,
    stats: BatchStats | None = None,
) -> Iterator[BatchResult]:
    """Run ``items`` ``parallel`` at a time on ``loaded`` (loaded with :func:`batch_load_options`).

    Yields one result per item as it completes. A request whose prompt does not fit, or that the
    template cannot render, becomes an error result; :class:`InputError` items come back as error
    results in turn. ``stats``, when given, collects the engine's aggregate figures.
    """
    from localinfer.backends.local import LocalBackend

    backend = LocalBackend(loaded)
    return backend.run_batch(items, lambda item: to_request(item, defaults, backend), parallel, stats=stats)


# -- sizing ---------------------------------------------------------------------------------------

_CACHE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}


def _layer_max(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, (list, tuple)) and value:
        return max(int(v) for v in value)
    return None


def kv_bytes_per_token(resolved: ResolvedModel, cache_type_k: str = "f16", cache_type_v: str = "f16") -> int | None:
    """KV-cache bytes one token takes, from the GGUF header (an upper bound: no sliding window)."""
    info = resolved.info
    n_layer, n_embd = info.block_count, info.embedding_length
    n_head, n_head_kv = _layer_max(info.head_count), _layer_max(info.head_count_kv)
    if not (n_layer and n_embd and n_head):
        return None
    arch = info.architecture or ""
    key_len = info.metadata.get(f"{arch}.attention.key_length")
    val_len = info.metadata.get(f"{arch}.attention.value_length")
    head_k = key_len if isinstance(key_len, int) else n_embd // n_head
    head_v = val_len if isinstance(val_len, int) else n_embd // n_head
    kv_heads = n_head_kv or n_head
    per_layer = kv_heads * (head_k * _CACHE_BYTES.get(cache_type_k, 2.0) + head_v * _CACHE_BYTES.get(cache_type_v, 2.0))
    return int(math.ceil(n_layer * per_layer))


def default_ctx_per_seq(resolved: ResolvedModel) -> int:
    """Like `run`: the model's trained context, at most 4096 tokens."""
    from localinfer.engine.types import DEFAULT_CTX_CEILING

    return min(resolved.info.context_length or DEFAULT_CTX_CEILING, DEFAULT_CTX_CEILING)


def default_parallel(
    n_pending: int,
    *,
    kv_bytes_per_seq: int | None,
    available_bytes: int | None,
    physical_cores: int,
    gpu: bool,
) -> int:
    """How many sequences to run at once when --parallel is not given.

    On a CPU, decode reads every weight once per step whatever the batch, so batching pays until
    the cores run out of arithmetic: 4 sequences per physical core (llama-batched-bench on 2 cores:
    B=8 gives 1.8x B=1), at most 16; on a GPU, 16. Never more than half the available memory
    holds in KV cache, and never more than there are requests.
    """
    by_cores = 16 if gpu else min(16, max(1, 4 * physical_cores))
    by_memory = by_cores
    if kv_bytes_per_seq and available_bytes:
        by_memory = max(1, int(available_bytes * 0.5 // kv_bytes_per_seq))
    return max(1, min(by_cores, by_memory, max(1, n_pending)))


def batch_load_options(base: LoadOptions, *, parallel: int, ctx_per_seq: int) -> LoadOptions:
    """One context for ``parallel`` sequences of ``ctx_per_seq`` tokens each. The KV cache is not
    unified: a stream per sequence gives each the logits it would have alone (a unified pool, even
    where it would decode drafts of uneven lengths in one pass, moved concurrent sequences' logits by
    up to 1.09, by what the other sequences held: benchmarks/results/draft-rows-2026-12-04.txt)."""
    if parallel < 1:
        raise UsageError("--parallel must be at least 1")
    return dataclasses.replace(
        base,
        n_ctx=ctx_per_seq * parallel,
        n_seq_max=parallel,
        n_batch=max(base.n_batch, parallel),
    )


# -- the job ----------------------------------------------------------------------------------------


@dataclass
class BatchSummary:
    """What the end-of-job summary says (docs/metrics.md: completion tokens, latency...)."""

    requests: int = 0  # in the input
    skipped: int = 0  # already in the output (--resume)
    completed: int = 0  # answered in this run
    errors: int = 0  # error records written in this run
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_s: float = 0.0  # from the first request taken up to the last result
    parallel: int = 0
    latencies: list[float] = field(default_factory=list)
    decode_tps: float | None = None  # aggregate, over decode-only steps (llama-batched-bench's S_TG)
    interrupted: bool = False

    @property
    def done(self) -> int:
        return self.completed + self.errors

    @property
    def tokens_per_s(self) -> float | None:
        """Completion tokens over the wall time (prefill included): the job's real throughput."""
        return self.completion_tokens / self.wall_s if self.wall_s > 0 and self.completion_tokens else None

    def latency(self, q: float) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


Progress = Callable[[BatchSummary, int], None]  # (summary so far, total pending)


def execute(
    items: Sequence[BatchRequest | InputError],
    backend: Backend,
    parallel: int,
    defaults: BatchDefaults,
    write: Callable[[dict[str, Any]], None],
    *,
    on_error: str = "skip",
    keep_order: bool = False,
    progress: Progress | None = None,
    summary: BatchSummary | None = None,
) -> BatchSummary:
    """Run ``items`` on ``backend`` and hand each output record to ``write`` (completion order, or
    input order), here or on a server alike.

    ``on_error="abort"`` raises the first request's error (after writing what finished before it);
    a failure every request would meet (a refused key) raises whatever ``on_error`` says.
    ``summary`` is filled in as results come, so it is right even if this raises or is interrupted.
    """
    summary = summary or BatchSummary()
    summary.parallel = parallel
    stats = backend.batch_stats()
    order: OutputOrder[BatchResult] = OutputOrder(keep_order)
    t0 = time.perf_counter()
    results = backend.run_batch(items, lambda item: to_request(item, defaults, backend), parallel, stats=stats)

    def settle() -> None:
        summary.wall_s = time.perf_counter() - t0
        if stats is not None:
            summary.decode_tps = stats.decode_tps

    try:
        for result in results:
            if result.error is not None and (result.fatal or on_error == "abort"):
                raise result.exc or UsageError(result.error)
            for r in order.release(result.index, result):
                write(r.to_json())
                _account(summary, r)
            settle()
            if progress is not None:
                progress(summary, len(items))
    except KeyboardInterrupt:
        summary.interrupted = True
        raise
    finally:
        results.close()  # now, not when the traceback lets go of it: the model may be closed next
        settle()
    return summary


def _account(summary: BatchSummary, r: BatchResult) -> None:
    if r.answer is None:
        summary.errors += 1
        return
    summary.completed += 1
    summary.prompt_tokens += r.answer.prompt_tokens or 0
    summary.completion_tokens += r.answer.completion_tokens or 0
    summary.latencies.append(r.answer.total_s)


def check_items(items: Iterable[BatchRequest | InputError], on_error: str) -> None:
    """Before anything runs: duplicate ids are a usage error, and so is a bad line under abort."""
    seen: dict[str, int] = {}
    dups: list[str] = []
    for item in items:
        if on_error == "abort" and isinstance(item, InputError):
            raise UsageError(f"line {item.line}: {item.reason}", hint="fix the line, or use --on-error skip")
        if item.id is None:
            continue
        key = id_key(item.id)
        if key in seen:
            dups.append(f"{item.id!r} (lines {seen[key]} and {item.line})")
        else:
            seen[key] = item.line
    if dups:
        more = f" and {len(dups) - 3} more" if len(dups) > 3 else ""
        raise UsageError(f"duplicate ids in the input: {', '.join(dups[:3])}{more}", hint="every request needs its own id")
