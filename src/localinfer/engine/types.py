"""Plain values the engine takes and gives: options and jobs in, steps, results and stats out.

No llama_cpp here, so the CLI and tests can build these without loading anything heavy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localinfer.request.sampling import SamplingOptions

if TYPE_CHECKING:
    import threading

    from localinfer.request.structured import Format


@dataclass(frozen=True)
class LoadOptions:
    """How to load a model and size its context."""

    n_ctx: int | None = None  # None: the model's trained context, capped at DEFAULT_CTX_CEILING
    n_threads: int | None = None  # None: physical cores; used for prefill and decode alike
    n_threads_batch: int | None = None  # None: same as n_threads
    n_gpu_layers: int = 0  # -1 = all
    n_batch: int = 2048
    n_ubatch: int = 512
    n_seq_max: int = 1
    flash_attn: str = "auto"  # auto | on | off
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    use_mmap: bool = True
    use_mlock: bool = False
    cpu_repack: bool | None = None  # None: on, except on AMX CPUs (see engine.backend.cpu_repack_enabled)
    verbose: bool = False  # llama.cpp's log to stderr (it is always captured for error messages)
    # "host:port" of ggml-rpc-servers whose devices to use: registered by whoever plans the load
    # (generate.loading.load, the bench), before it, with engine.rpc.add_servers; the engine's LlamaModel does not
    rpc_servers: tuple[str, ...] = ()
    # speculative decoding (engine/draft.py): "ngram" drafts by lookup in the prompt and the answer;
    # draft_max: tokens per draft (None: the default); draft_model: the name of a second model that
    # guesses (engine/draft_model.py; resolved and loaded by generate.drafting)
    draft: str | None = None
    draft_max: int | None = None
    draft_model: str | None = None

    def __post_init__(self) -> None:
        if self.draft is not None or self.draft_max is not None or self.draft_model is not None:
            from localinfer.engine.draft import check

            check(self.draft, self.draft_max, self.draft_model)


DEFAULT_CTX_CEILING = 4096
GPU_LAYERS_AUTO = -2  # LoadOptions.n_gpu_layers: resolved by the pre-flight (-1 = all)


@dataclass(frozen=True)
class Step:
    """One piece of streamed output. ``text`` may be empty (a token that completes no character)."""

    text: str
    token: int | None


@dataclass
class GenerationStats:
    """What one request measured; filled in by the engine as it goes (see docs/metrics.md)."""

    prompt_tokens: int = 0  # the whole prompt, in tokens
    cached_tokens: int = 0  # reused from the KV cache, not evaluated
    completion_tokens: int = 0  # tokens sampled (an end-of-generation token is not counted)
    prefill_s: float = 0.0  # evaluating the non-cached prompt tokens
    decode_s: float = 0.0  # from the first sampled token to the last one
    decode_calls_s: float = 0.0  # of decode_s, the time spent inside llama_decode itself
    first_token_s: float | None = None  # request start -> first token sampled (engine side)
    finish_reason: str | None = None  # stop | length | interrupted
    stop_string: str | None = None  # with "stop": the stop string that matched (None: end of generation)
    truncated_tokens: int = 0  # dropped from the prompt by --on-overflow truncate
    n_ctx: int = 0
    context_used: int = 0  # tokens in the context when the request ended
    document: str | None = None  # under a constraint: "complete", or "incomplete" (cut, or never begun)
    # asked for (SeqJob.logprobs): one entry per counted token, OpenAI's content shape (engine.logprobs)
    logprobs: list[dict[str, Any]] | None = None
    draft: str | None = None  # speculative decoding's drafter ("ngram"), None: off
    draft_tokens: int = 0  # tokens drafted
    draft_accepted: int = 0  # of those, kept (what the model chose itself)
    draft_steps: int = 0  # drafts verified (each one batch)
    image_tokens: int = 0  # of prompt_tokens, the images' (engine.vision)
    image_encode_s: float = 0.0  # encoding the images (libmtmd), apart from prefill_s
    extra: dict = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        """Every field, as JSON (``from_wire`` is the inverse): what crosses a process with its answer."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> GenerationStats:
        """The stats ``to_wire`` wrote (a field another version did not write keeps its default)."""
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})

    @property
    def evaluated_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def prefill_tps(self) -> float | None:
        if self.prefill_s <= 0 or self.evaluated_tokens <= 0:
            return None
        return self.evaluated_tokens / self.prefill_s

    @property
    def decode_tps(self) -> float | None:
        """Tokens after the first over the time they took (the first comes from prefill)."""
        n = self.completion_tokens - 1
        if n <= 0 or self.decode_s <= 0:
            return None
        return n / self.decode_s


@dataclass(frozen=True)
class SeqJob:
    """One sequence to run: its prompt tokens and how to sample. ``key`` comes back in the result."""

    key: Any
    tokens: Sequence[int]
    sampling: SamplingOptions = SamplingOptions()
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    on_text: Callable[[str], None] | None = None  # each piece of answer text, on the decoding thread
    cancel: threading.Event | None = None  # set from any thread: the job ends at the next step
    cache_prompt: bool = True  # False: evaluate the whole prompt, reusing no cached prefix
    constraint: Format | None = None  # the answer must be this JSON / grammar (engine/constrain.py)
    constraint_after: str | None = None  # the constraint starts once the answer has passed this text (</think>)
    logprobs: int | None = None  # None: off; N: each token's log probability and the top N (0-20)
    # with logprobs, instead of on_text: each piece of text with the entries of the tokens it holds
    on_logprobs: Callable[[str, list[dict[str, Any]]], None] | None = None
    draft: bool | None = None  # speculative decoding: None as the model was loaded (--draft), or on/off
    # this job's draft sizes (serve's speculative.n_max / n_min): None as loaded; a max of 0 drafts nothing
    draft_max: int | None = None
    draft_min: int = 0
    # the prompt's progress, on the decoding thread: (cached, evaluated so far, cached included) at
    # admission, when the reused prefix is known, then after each decode that carried its tokens
    on_prompt: Callable[[int, int], None] | None = None


@dataclass
class SeqResult:
    """What one sequence produced. Times are ``time.perf_counter()`` values; ``error`` is set when the
    job was refused (it never ran). A cancelled job ends with finish reason ``interrupted``."""

    key: Any
    text: str
    stats: GenerationStats
    t_admit: float = 0.0  # the job took a slot
    t_end: float = 0.0  # its last token was sampled
    error: str | None = None
