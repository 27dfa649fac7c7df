"""Loading GGUF models into llama.cpp and generating with them (through llama-cpp-python's
low-level bindings; process-wide state and machine facts are in ``engine.backend``).

We drive llama.cpp directly - one batch per decode, the native sampler chain, our own KV-cache
bookkeeping - instead of going through ``llama_cpp.Llama``: it keeps the per-token overhead near
zero, lets us time prefill and decode exactly, and reuse the cache across chat turns.
"""

from __future__ import annotations

import codecs
import ctypes
import os
import secrets
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from localinfer.engine.backend import (
    GGML_BF16,
    cpu_repack_enabled,
    default_threads,
    ensure_backend,
    join_past_interrupts,
    llama_cpp,
    load_mode,
    stdout_to_stderr,
    supports_gpu_offload,
)
from localinfer.engine.load_errors import diagnose_load_failure
from localinfer.engine import kvstate
from localinfer.engine import twin as _twin
from localinfer.engine.stopping import StopMatcher
from localinfer.engine.types import (
    DEFAULT_CTX_CEILING,
    GenerationStats,
    LoadOptions,
    SamplingOptions,
    Step,
)
from localinfer.errors import GenerationError, ResourceError
from localinfer.paths import file_identity

if TYPE_CHECKING:  # pragma: no cover - typing only
    from localinfer.hardware import MemoryBudget

_CACHE_TYPES = {
    "f32": llama_cpp.GGML_TYPE_F32,
    "f16": llama_cpp.GGML_TYPE_F16,
    "bf16": GGML_BF16,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
    "q4_1": llama_cpp.GGML_TYPE_Q4_1,
    "q5_0": llama_cpp.GGML_TYPE_Q5_0,
    "q5_1": llama_cpp.GGML_TYPE_Q5_1,
}
_FLASH_ATTN = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


def _model_params(options: LoadOptions):  # noqa: ANN202 - a ctypes struct
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = options.n_gpu_layers if options.n_gpu_layers >= 0 else 2**31 - 1
    mparams.load_mode = load_mode(options.use_mmap, options.use_mlock)
    mparams.use_extra_bufts = cpu_repack_enabled(options.cpu_repack)
    return mparams


def _params_key(path: Path, mparams) -> tuple:  # noqa: ANN001
    # The file's identity too: a load ahead may have begun before the name was resolved (preload's
    # hints), and resolving may have rewritten the file at that path since (a repair, a new pull).
    # The path as the OS resolves it: a hint notes it absolute, `run -m ./model.gguf` gives it relative.
    return (os.path.realpath(path), file_identity(path), mparams.n_gpu_layers, mparams.load_mode,
            bool(mparams.use_extra_bufts))


class _Preload:
    """A model load started ahead on a thread (``preload_model``), waiting for ``Model`` to take it."""

    def __init__(
        self, path: Path, options: LoadOptions, twin_budget: MemoryBudget | None, twin_vocab: tuple[str, int] | None
    ) -> None:
        import threading

        self.log = ensure_backend(options.verbose)
        self.log_start = self.log.seq
        mparams = _model_params(options)
        self.key = _params_key(path, mparams)
        self.model = None
        self.seconds = 0.0
        # The AMX decoding twin (engine.twin), when the answer may be long enough to want one: its
        # weights load beside these, on the core Python's start-up leaves idle.
        self.twin: _twin.DecodeTwin | None = None
        self.twin_budget = twin_budget
        if twin_budget is not None and _twin.possible(options.n_gpu_layers, options.cpu_repack, options.n_seq_max):
            self.twin = _twin.DecodeTwin(path, mparams, vocab=twin_vocab)
        # Each line llama.cpp logs from the loading thread needs the GIL, which the main thread
        # (importing, parsing) would otherwise hold for up to 5 ms at a time.
        self._interval = sys.getswitchinterval()
        sys.setswitchinterval(0.0002)
        self.thread = threading.Thread(target=self._run, args=(path, mparams), name="localinfer-preload", daemon=True)
        self.thread.start()

    def _run(self, path: Path, mparams) -> None:  # noqa: ANN001
        t0 = time.perf_counter()
        try:
            with stdout_to_stderr():
                self.model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), mparams) or None
        finally:
            self.seconds = time.perf_counter() - t0
            sys.setswitchinterval(self._interval)

    def take(self, key: tuple):  # noqa: ANN201
        """The loaded model if it was loaded for ``key`` (waiting for it); otherwise it is freed."""
        self.thread.join()
        model, self.model = self.model, None
        if model is not None and key != self.key:
            llama_cpp.llama_model_free(model)
            model = None
        return model

    def take_twin(self, taken: bool) -> _twin.DecodeTwin | None:
        """The twin started with this load, if the load was ``taken``; otherwise it is stopped (it frees
        itself; ``twin.settle`` waits for it)."""
        twin, self.twin = self.twin, None
        if twin is not None and not taken:
            twin.cancel()
            twin = None
        return twin


_preloaded: list[_Preload] = []  # at most one per process


def preload_model(
    path: str | os.PathLike,
    options: LoadOptions = LoadOptions(),
    *,
    twin_budget: MemoryBudget | None = None,
    twin_vocab: tuple[str, int] | None = None,
) -> bool:
    """Start loading ``path``'s weights on a thread, for the next ``Model(path, ...)`` to take.

    Only where the load does not depend on a memory plan: CPU-only builds (GPU builds decide the
    offloaded layers from free VRAM first). The GGUF must have been validated already. Returns
    whether a load was started. ``twin_budget`` (the memory measured before): the first answer may
    be long, so the AMX decoding twin starts loading too, where this CPU and these settings allow
    one; the model takes it if its memory check (``twin.wanted``, against this budget) agrees.
    ``twin_vocab``: (architecture, vocabulary size) from the GGUF's header, for the twin to load
    without the tokenizer (engine.twin).
    """
    if _preloaded or supports_gpu_offload() or options.verbose:
        return False
    _preloaded.append(_Preload(Path(path), options, twin_budget, twin_vocab))
    return True


def weights_loading():  # noqa: ANN201 - a threading.Thread or None
    """The thread loading weights ahead (``preload_model``) until ``Model`` takes them, if any: a
    thread about to run Python for a while can wait for it (each line llama.cpp logs needs the GIL)."""
    return _preloaded[0].thread if _preloaded else None


def settle_preload() -> None:
    """Wait for a load still running ahead: llama.cpp must not be mid-load when the interpreter exits
    (its exit-time cleanup would run under the loading thread). A second Ctrl-C does not cut this short."""
    for pre in _preloaded:
        join_past_interrupts(pre.thread)


class Model:
    """A loaded GGUF model with one context (``n_seq_max`` sequences share it)."""

    def __init__(self, path: str | os.PathLike, options: LoadOptions = LoadOptions()) -> None:
        self.path = Path(path)
        self.options = options
        log = ensure_backend(options.verbose)
        log_start = log.seq
        t0 = time.perf_counter()
        mparams = _model_params(options)
        self._model = None
        self._ctx = None
        self._twin: _twin.DecodeTwin | None = None
        model, ahead_s, twin_ahead, twin_budget = None, 0.0, None, None
        if _preloaded:  # a load started ahead (preload_model): taken if it is this one
            pre = _preloaded[0]
            model = pre.take(_params_key(self.path, mparams))
            twin_ahead = pre.take_twin(model is not None)
            if twin_ahead is not None:  # the memory measured before both loads (the twin's would count)
                twin_budget = pre.twin_budget
            _preloaded.clear()  # only now: interrupted while waiting, settle_preload() still waits
            if model is not None:
                log_start, ahead_s = pre.log_start, pre.seconds
                t0 = time.perf_counter()  # the wait for it is part of ahead_s
        _twin.settle(keep=twin_ahead)  # other twins still loading: their memory is wanted now
        if model is None:
            with stdout_to_stderr():
                model = llama_cpp.llama_model_load_from_file(str(self.path).encode("utf-8"), mparams)
        if not model:
            if twin_ahead is not None:
                twin_ahead.cancel()
            raise diagnose_load_failure(log, self.path, "load", log_start)
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(model))
        n_ctx = options.n_ctx or min(self.n_ctx_train or DEFAULT_CTX_CEILING, DEFAULT_CTX_CEILING)
        threads = options.n_threads or default_threads()
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = min(options.n_batch, n_ctx) if options.n_seq_max == 1 else options.n_batch
        cparams.n_ubatch = min(options.n_ubatch, cparams.n_batch)
        cparams.n_seq_max = options.n_seq_max
        cparams.n_threads = threads
        cparams.n_threads_batch = options.n_threads_batch or threads
        cparams.flash_attn_type = _FLASH_ATTN[options.flash_attn]
        cparams.type_k = _CACHE_TYPES[options.cache_type_k]
        cparams.type_v = _CACHE_TYPES[options.cache_type_v]
        cparams.no_perf = True
        with stdout_to_stderr():
            ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            err = diagnose_load_failure(log, self.path, "create a context for", log_start)
            if twin_ahead is not None:
                twin_ahead.cancel()
            llama_cpp.llama_model_free(model)
            self._model = None
            raise err
        self._ctx = self._ctx_prompt = ctx  # _ctx: the context holding the live cache (see engine.twin)
        # llama.cpp's own figures for this load ("CPU KV buffer size = 11.25 MiB", "offloaded 31/31
        # layers to GPU"): parsed by localinfer.estimate.parse_buffer_report.
        self.memory_log = tuple(t for _, t in log.since(log_start) if "buffer size =" in t or "offloaded" in t)
        self._mem = self._mem_prompt = llama_cpp.llama_get_memory(ctx)
        self.n_ctx = int(llama_cpp.llama_n_ctx(ctx))
        self.n_batch = int(cparams.n_batch)
        self.n_threads = threads
        self.n_threads_batch = int(cparams.n_threads_batch)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.load_s = ahead_s + time.perf_counter() - t0
        self._outs: dict[int, tuple[bytes, str | None, bool]] = {}  # see _learn
        self._piece_buf = ctypes.create_string_buffer(256)
        self._one = (llama_cpp.llama_token * 1)()
        self._one_batch = llama_cpp.llama_batch_get_one(self._one, 1)
        self._tokens: list[int] = []  # what sequence 0 holds in the KV cache, in order
        self._params = (mparams, cparams)
        self._prompt_v_transposed: bool | None = None  # this context's V cache layout, once read (engine.kvstate)
        self._twin_flash_attn = False  # the twin keeps this context's flash attention (its cache did not convert)
        self._twin_wanted = _twin.wanted(
            options.n_gpu_layers, options.cpu_repack, options.n_seq_max, self._twin_bytes, twin_budget
        )
        if twin_ahead is not None:  # its weights are loading (or loaded); its context waits (_to_twin)
            if self._twin_wanted:
                self._twin = twin_ahead
            else:
                twin_ahead.cancel()

    # -- lifecycle ---------------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "_twin", None) is not None:
            self._twin.close()
            self._twin = None
        self._ctx = getattr(self, "_ctx_prompt", self._ctx)
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = self._ctx_prompt = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        if sys.is_finalizing():
            # The process is ending: the OS takes the memory back at once, where freeing llama.cpp's
            # contexts, vocabulary and mappings one by one costs ~25 ms (cli.run keeps its model for this).
            return
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    # -- model facts -------------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    @property
    def vocab_shape(self) -> tuple[str, int] | None:
        """(architecture, vocabulary size): what loading a copy without the tokenizer needs (engine.twin)."""
        arch = self.meta("general.architecture")
        return (arch, self.n_vocab) if arch else None

    @property
    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    @property
    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self._model, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    @property
    def n_layer(self) -> int:
        return int(llama_cpp.llama_model_n_layer(self._model))

    @property
    def size_bytes(self) -> int:
        return int(llama_cpp.llama_model_size(self._model))

    @property
    def n_params(self) -> int:
        return int(llama_cpp.llama_model_n_params(self._model))

    def token_text(self, token: int) -> str:
        return self._piece(token, special=True).decode("utf-8", errors="replace")

    @property
    def bos_text(self) -> str:
        tok = llama_cpp.llama_vocab_bos(self._vocab)
        return self.token_text(tok) if tok >= 0 else ""

    @property
    def eos_text(self) -> str:
        tok = llama_cpp.llama_vocab_eos(self._vocab)
        return self.token_text(tok) if tok >= 0 else ""

    @property
    def add_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    # -- tokens --------------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        arr = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            arr = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            raise GenerationError("tokenization failed")
        return list(arr[:n])

    def _piece(self, token: int, special: bool = False) -> bytes:
        buf = self._piece_buf
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def _learn(self, token: int) -> tuple[bytes, str | None, bool]:
        """What a sampled token adds to the answer, cached: its bytes (control tokens render as
        nothing), their text when they are whole UTF-8 characters on their own (else None: part of
        a character split across tokens), and whether it ends generation."""
        raw = self._piece(token)
        try:
            text: str | None = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        out = self._outs[token] = (raw, text, bool(llama_cpp.llama_vocab_is_eog(self._vocab, token)))
        return out

    def piece(self, token: int) -> bytes:
        """The bytes a sampled token adds to the answer (control tokens render as nothing)."""
        return (self._outs.get(token) or self._learn(token))[0]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    # -- KV cache --------------------------------------------------------------------------------------
    @property
    def cached_tokens(self) -> list[int]:
        return list(self._tokens)

    def reset(self) -> None:
        """Forget everything in the KV cache (a new conversation)."""
        llama_cpp.llama_memory_clear(self._mem, True)
        if self._mem is not self._mem_prompt:  # the live cache was on the decoding twin
            llama_cpp.llama_memory_clear(self._mem_prompt, True)
            self._ctx, self._mem = self._ctx_prompt, self._mem_prompt
        self._tokens = []

    def _to_prompt_side(self) -> None:
        """Prompts are evaluated on the main context: bring the live cache back from the twin (its
        V cache converted back to this context's layout: engine.kvstate)."""
        if self._ctx is self._ctx_prompt:
            return
        state = _twin.sequence_state(self._ctx) if self._tokens else None
        if not self._restore_prompt_side(state):
            llama_cpp.llama_memory_clear(self._mem_prompt, True)
            self._tokens.clear()  # in place: a running answer's loop holds this list
        self._ctx, self._mem = self._ctx_prompt, self._mem_prompt

    def _restore_prompt_side(self, state: bytes | None) -> bool:
        """Put a cache saved on the twin into this context, converted to its V layout where that is
        known (otherwise both keep the same one); whether that worked."""
        if state is not None and self._prompt_v_transposed is not None:
            state = kvstate.with_v_layout(state, self._prompt_v_transposed, int(self._params[1].type_v))
        return _twin.restore_sequence(self._ctx_prompt, state)

    def _to_twin(self, reach: int):  # noqa: ANN202 - a llama_context pointer
        """Move the live cache to the decoding twin (waiting for its load); the context to decode on.
        ``reach``: the most tokens the sequence can hold by the answer's end. The twin's context is
        created now if it was not yet (the prompt's evaluation is over), with room for ``reach``:
        most of its creation is its KV cache's memory being faulted in and cleared (~60 ms for 4096
        tokens, ~8 for 512), and the answer waits for it. An answer that needs more room than it
        has gets one as large again, or more (``_grow_twin`` does the same mid-answer).

        The twin decodes without flash attention, faster once the cache is deep (``engine.kvstate``):
        the cache's V layout is converted on the way. The first answer there keeps this context's
        flash attention if it stays shallow (``twin.shallow``), with a BF16 V cache
        (``twin.decode_settings``): the V values are converted too. A cache that cannot be
        converted (a layout ``kvstate`` does not know) is copied as it is, into a context made again
        with this one's flash attention and cache types."""
        twin = self._twin
        if twin is None:
            return self._ctx
        state = _twin.sequence_state(self._ctx_prompt)
        if state is not None and self._prompt_v_transposed is None:
            self._prompt_v_transposed = kvstate.v_layout(state)
            # A layout kvstate cannot read cannot be converted: the twin keeps this one's
            self._twin_flash_attn = self._prompt_v_transposed is None
        keep = self._twin_keeps_flash_attn(_twin.shallow(len(self._tokens), reach, self._twin_bf16()))
        twin.start_context(self._twin_settings(reach, keep))  # unless it has settings already
        ok = twin.ready()
        if ok:  # made again if too small, or with the wrong flash attention or V type
            too_small = twin.n_ctx < min(reach, self.n_ctx)
            size = max(reach, 2 * twin.n_ctx) if too_small else twin.n_ctx
            wanted = self._twin_settings(size, keep)
            if too_small or _twin.transposes(wanted) != twin.v_transposed or wanted.type_v != twin.v_type:
                ok = twin.remake(wanted)
        if ok and state is not None and self._prompt_v_transposed is not None:
            state = kvstate.with_v_layout(state, twin.v_transposed, twin.v_type)
        if ok and _twin.restore_sequence(twin.ctx, state):
            self._ctx, self._mem = twin.ctx, twin.mem
        else:  # it failed to load or to take the cache: decode here from now on
            self._drop_twin()
        return self._ctx

    def _grow_twin(self):  # noqa: ANN202 - (a llama_context pointer, its size)
        """The answer has filled the twin's context: make it twice as large (at most this one's size)
        and carry on there, or, if that fails, back here. The context to decode on, and its size.
        An answer that kept flash attention (``twin.shallow``) and has now gone deep carries on
        without it, its cache converted (``engine.kvstate``): the context is made again anyway."""
        twin = self._twin
        state = _twin.sequence_state(twin.ctx)
        # Until the cache is in the new context, the live one is this context's (it holds the prompt):
        # an interruption meanwhile resyncs against that, never against the freed context.
        self._ctx, self._mem = self._ctx_prompt, self._mem_prompt
        size = min(2 * twin.n_ctx, self.n_ctx)
        keep = self._twin_keeps_flash_attn(_twin.shallow(len(self._tokens), size, self._twin_bf16()))
        larger, moved = self._twin_settings(size, keep), state
        if state is not None and (_twin.transposes(larger) != twin.v_transposed or larger.type_v != twin.v_type):
            moved = kvstate.with_v_layout(state, _twin.transposes(larger), int(larger.type_v))
            if moved is None:  # a cache that does not convert goes on in the layout it has
                larger, moved = self._twin_settings(size, self._twin_keeps_flash_attn(True)), state
        if twin.remake(larger) and _twin.restore_sequence(twin.ctx, moved):
            self._ctx, self._mem = twin.ctx, twin.mem
            return twin.ctx, twin.n_ctx
        self._drop_twin()  # no memory for a larger one: the cache comes back here
        if not self._restore_prompt_side(state):
            self.reset()
            raise GenerationError("the KV cache was lost moving the answer off the AMX decoding twin")
        return self._ctx, self.n_ctx

    def _drop_twin(self) -> None:
        """The twin could not go on (a failed load, context or copy): free it, and decode here from now on."""
        twin, self._twin = self._twin, None
        self._twin_wanted = False
        if twin is not None:
            twin.close()

    def _twin_keeps_flash_attn(self, shallow: bool) -> bool:
        """Whether the twin's next context keeps this context's flash attention, for an answer that
        stays ``shallow`` or not (``twin.shallow``): always where its cache's layout cannot be
        converted; otherwise while the answer is shallow, unless the twin has it off already. The
        first answer picks (a twin with no settings yet has it); a context made while the user typed
        has it off, and none takes it up again. An answer that goes deep drops it, at its first
        answer, at a later one, or mid-answer as its context grows (``_grow_twin``)."""
        return self._twin_flash_attn or (shallow and not self._twin.v_transposed)

    def _twin_settings(self, reach: int, flash_attn: bool | None = None):  # noqa: ANN202 - a ctypes struct
        """The twin's context settings (``twin.decode_settings``), with room for ``reach`` tokens (in
        steps of 256) if that is less than this context's; ``flash_attn``: keep this context's flash
        attention (None: only where its cache's layout cannot be converted)."""
        n_ctx = min(self.n_ctx, -(-reach // 256) * 256)
        keep = self._twin_flash_attn if flash_attn is None else flash_attn
        return _twin.decode_settings(self._params[1], n_ctx, keep, keep and self._twin_bf16())

    def _twin_bf16(self) -> bool:
        """Whether the twin's contexts with flash attention get a BF16 V cache (``twin.decode_settings``):
        only for a cache kvstate converts, whose rows show that this context has flash attention on."""
        return not self._twin_flash_attn and self._prompt_v_transposed is False and _twin.bf16_v_applies(self._params[1])

    def prepare_decode_twin(self, idle: bool = True) -> None:
        """Start loading the AMX decoding twin (engine.twin) now, where this model would get one:
        the chat REPL does while the user types its first message, so that answer need not wait.
        ``idle``: nothing is evaluated meanwhile, so its context is created as soon as it loads;
        otherwise that waits for the first token (``_to_twin``)."""
        if self._twin_wanted and self._twin is None:
            settings = self._twin_settings(2 * _twin.ROOM) if idle else None
            self._twin = _twin.DecodeTwin(self.path, self._params[0], settings, vocab=self.vocab_shape)
        elif self._twin is not None and idle:
            self._twin.start_context(self._twin_settings(2 * _twin.ROOM))

    def _twin_bytes(self) -> int:
        """What a decoding twin would add: this load's buffers again, and the KV copy's buffer."""
        from localinfer.estimate import parse_buffer_report

        report = parse_buffer_report(self.memory_log)
        return report.total() + report.total("KV")

    @property
    def decodes_on_twin(self) -> bool:
        """Whether the last answer was decoded on the AMX twin (engine.twin)."""
        return self._ctx is not self._ctx_prompt

    def _reuse_prefix(self, prompt: Sequence[int]) -> int:
        """Keep the longest cached prefix of ``prompt`` (at least one token is left to evaluate)."""
        n = 0
        limit = min(len(self._tokens), len(prompt) - 1)
        cached = self._tokens
        while n < limit and cached[n] == prompt[n]:
            n += 1
        if n < len(self._tokens):
            if n == 0 or not llama_cpp.llama_memory_seq_rm(self._mem, 0, n, -1):
                # Some caches (e.g. sliding-window attention) cannot drop a suffix: start over.
                self.reset()
                n = 0
            else:
                del self._tokens[n:]
        return n

    def _decode(self, tokens: Sequence[int]) -> None:
        """Evaluate ``tokens`` on sequence 0, in batches of at most n_batch."""
        step = self.n_batch
        for start in range(0, len(tokens), step):
            chunk = tokens[start : start + step]
            if len(chunk) == 1:
                self._one[0] = chunk[0]
                batch = self._one_batch
            else:
                arr = (llama_cpp.llama_token * len(chunk))(*chunk)
                batch = llama_cpp.llama_batch_get_one(arr, len(chunk))
            rc = llama_cpp.llama_decode(self._ctx, batch)
            if rc != 0:
                self._decode_failed(rc)
            self._tokens.extend(chunk)

    def _decode_failed(self, rc: int) -> NoReturn:
        self._resync()
        if rc == 1:
            raise ResourceError(f"the context is full ({self.n_ctx} tokens)", hint="use a larger --ctx-size")
        raise GenerationError(f"llama_decode failed with code {rc}")

    def _resync(self) -> None:
        """Make our token list agree with the cache after an error or an interruption."""
        n = int(llama_cpp.llama_memory_seq_pos_max(self._mem, 0)) + 1
        if n == len(self._tokens):
            return
        # Ctrl-C usually lands just after a llama_decode returned, before its tokens were recorded:
        # drop that unrecorded tail instead of the whole cache (chat reuses the rest next turn).
        if n > len(self._tokens) > 0 and llama_cpp.llama_memory_seq_rm(self._mem, 0, len(self._tokens), -1):
            return
        self.reset()

    # -- sampling and generation -----------------------------------------------------------------------
    def _sampler(self, opts: SamplingOptions, history: Sequence[int]) -> tuple[ctypes.c_void_p, int]:
        seed = opts.seed if opts.seed is not None else secrets.randbits(31)
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        add = llama_cpp.llama_sampler_chain_add
        if opts.repeat_penalty != 1.0 and opts.repeat_last_n != 0:
            add(chain, llama_cpp.llama_sampler_init_penalties(self.n_vocab, opts.repeat_last_n, opts.repeat_penalty, 0.0, 0.0))
        if opts.greedy:
            add(chain, llama_cpp.llama_sampler_init_greedy())
        else:
            if opts.top_k > 0:
                add(chain, llama_cpp.llama_sampler_init_top_k(opts.top_k))
            if opts.top_p < 1.0:
                add(chain, llama_cpp.llama_sampler_init_top_p(opts.top_p, 1))
            if opts.min_p > 0.0:
                add(chain, llama_cpp.llama_sampler_init_min_p(opts.min_p, 1))
            add(chain, llama_cpp.llama_sampler_init_temp(opts.temperature))
            add(chain, llama_cpp.llama_sampler_init_dist(seed))
        if opts.repeat_penalty != 1.0:
            window = opts.repeat_last_n if opts.repeat_last_n > 0 else len(history)
            for tok in history[-window:]:
                llama_cpp.llama_sampler_accept(chain, tok)
        return chain, seed

    def generate(
        self,
        prompt: Sequence[int],
        sampling: SamplingOptions,
        stats: GenerationStats,
        *,
        max_tokens: int | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
    ) -> Iterator[Step]:
        """Evaluate ``prompt`` (reusing the cached prefix) and stream the answer.

        ``stats`` is filled in as the stream goes, so a consumer that stops early still has
        correct figures. The last token sampled is not evaluated (nobody needs its logits).
        """
        if not prompt:
            raise GenerationError("empty prompt: nothing to evaluate")
        t_start = time.perf_counter()
        stats.n_ctx = self.n_ctx
        stats.prompt_tokens = len(prompt)
        stats.finish_reason = None
        room = self.n_ctx - len(prompt)  # what the answer can reach at most
        use_twin = self._twin_wanted and min(room, max_tokens if max_tokens is not None else room) >= _twin.MIN_TOKENS
        try:
            self._to_prompt_side()
            if use_twin:  # if not loading yet: it loads while the prompt is evaluated
                self.prepare_decode_twin(idle=False)
            cached = self._reuse_prefix(prompt)
            stats.cached_tokens = cached
            t0 = time.perf_counter()
            self._decode(prompt[cached:])
            stats.prefill_s = time.perf_counter() - t0
            chain, seed = self._sampler(sampling, prompt)
            stats.extra["seed"] = seed
            try:
                yield from self._sample_loop(chain, stats, t_start, max_tokens, stop, ignore_eos, use_twin)
            finally:
                llama_cpp.llama_sampler_free(chain)
        except (KeyboardInterrupt, GeneratorExit):
            stats.finish_reason = stats.finish_reason or "interrupted"
            self._resync()
            raise
        finally:
            stats.context_used = len(self._tokens)

    def _sample_loop(
        self,
        chain: ctypes.c_void_p,
        stats: GenerationStats,
        t_start: float,
        max_tokens: int | None,
        stop: Sequence[str],
        ignore_eos: bool,
        to_twin: bool = False,
    ) -> Iterator[Step]:
        # The per-token path. Every step here runs with the CPU caches just flushed by llama_decode
        # (it streams all the weights), so it touches as little as it can: one dict lookup per
        # token, the decoder and stop matcher only when a piece needs them, one ctypes call each to
        # sample and to decode.
        sample = llama_cpp.llama_sampler_sample
        decode = llama_cpp.llama_decode
        ctx, one, batch, cached = self._ctx, self._one, self._one_batch, self._tokens
        outs, learn = self._outs, self._learn
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        held = False  # the decoder holds the first bytes of a character split across tokens
        matcher = StopMatcher(stop)
        feed = matcher.feed
        clock = time.perf_counter
        n_ctx = self.n_ctx
        limit = max_tokens if max_tokens is not None else n_ctx + 1
        n_gen = 0
        room = n_ctx  # the cells of the context decoding
        t_first = 0.0
        if limit <= 0:
            stats.finish_reason = "length"
            return
        while True:
            token = sample(chain, ctx, -1)
            now = clock()
            if n_gen == 0:
                t_first = now
                stats.first_token_s = now - t_start
            raw, text, eog = outs.get(token) or learn(token)
            if eog and not ignore_eos:
                stats.finish_reason = "stop"
                tail = matcher.flush() + decoder.decode(b"", final=True)
                if tail:
                    yield Step(tail, None)
                return
            n_gen += 1
            stats.completion_tokens = n_gen
            stats.decode_s = now - t_first
            if text is None or held:
                text = decoder.decode(raw)
                held = bool(decoder.getstate()[0])
            text, hit = feed(text)
            if text or hit:
                yield Step(text, token)
            if hit:
                stats.finish_reason = "stop"
                return
            if n_gen >= limit or len(cached) >= n_ctx:
                stats.finish_reason = "length"
                tail = matcher.flush() + decoder.decode(b"", final=True)
                if tail:
                    yield Step(tail, None)
                return
            if to_twin:  # after the first token: decode the rest on the AMX twin (engine.twin)
                to_twin = False
                ctx = self._to_twin(len(cached) + min(limit - n_gen, _twin.ROOM) + 1)
                room = self._twin.n_ctx if ctx is not self._ctx_prompt else n_ctx
            elif len(cached) >= room:  # the twin's context is full (not this one's: checked above)
                ctx, room = self._grow_twin()
            one[0] = token
            t_call = clock()
            rc = decode(ctx, batch)
            stats.decode_calls_s += clock() - t_call
            if rc != 0:
                self._decode_failed(rc)
            cached.append(token)
