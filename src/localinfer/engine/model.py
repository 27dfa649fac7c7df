"""A GGUF model loaded into llama.cpp, and generation with it (through llama-cpp-python's
low-level bindings; process-wide state and machine facts are in ``engine.backend``).

We drive llama.cpp directly - one batch per decode, the native sampler chain, our own KV-cache
bookkeeping - instead of going through ``llama_cpp.Llama``: it keeps the per-token overhead near
zero, lets us time prefill and decode exactly, and reuse the cache across chat turns.
"""

from __future__ import annotations

import codecs
import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from localinfer.engine.backend import ensure_backend, interruptible, llama_cpp, stdout_to_stderr
from localinfer.engine.load_errors import diagnose_load_failure
from localinfer.engine.logprobs import Logprobs
from localinfer.engine.params import context_params, model_params
from localinfer.engine.sampling import build_sampler, free_sampler
from localinfer.engine.stopping import StopMatcher
from localinfer.engine.vocab import Vocab
from localinfer.engine.types import DEFAULT_CTX_CEILING, GenerationStats, LoadOptions, Step
from localinfer.request.sampling import SamplingOptions
from localinfer.errors import GenerationError, ResourceError

if TYPE_CHECKING:
    from localinfer.request.structured import Format


class Model(Vocab):
    """A loaded GGUF model with one context (``n_seq_max`` sequences share it)."""

    def __init__(self, path: str | os.PathLike, options: LoadOptions = LoadOptions(), *,
                 meanwhile: Callable[[], None] | None = None) -> None:  # fmt: skip
        """Load ``path`` and create its context; Ctrl-C stops the load between tensors (llama.cpp's
        progress callback, backend.interruptible). ``meanwhile``: Python work done on a helper thread
        while the model loads (llama.cpp releases the GIL)."""
        self.path = Path(path)
        self.options = options
        self._model = self._ctx = None
        log = ensure_backend(options.verbose)
        log_start = log.seq
        t0 = time.perf_counter()
        cancel = threading.Event()
        mparams = model_params(options)
        # replaces llama.cpp's own, which logs a dot per percent
        mparams.progress_callback = progress = llama_cpp.llama_progress_callback(lambda _done, _data: not cancel.is_set())
        with stdout_to_stderr():
            model = interruptible(lambda: llama_cpp.llama_model_load_from_file(str(self.path).encode("utf-8"), mparams),
                                  cancel=cancel, free=llama_cpp.llama_model_free, meanwhile=meanwhile)  # fmt: skip
        del progress  # kept alive through the load
        if not model:
            raise diagnose_load_failure(log, self.path, "load", log_start)
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(model))
        n_ctx = options.n_ctx or min(self.n_ctx_train or DEFAULT_CTX_CEILING, DEFAULT_CTX_CEILING)
        cparams = context_params(options, n_ctx)
        try:
            with stdout_to_stderr():
                ctx = interruptible(lambda: llama_cpp.llama_init_from_model(model, cparams), free=llama_cpp.llama_free)
        except BaseException:
            self.close()
            raise
        if not ctx:
            err = diagnose_load_failure(log, self.path, "create a context for", log_start)
            self.close()
            raise err
        self._ctx = ctx
        # llama.cpp's own figures for this load ("CPU KV buffer size = 11.25 MiB", "offloaded 31/31
        # layers to GPU"): parsed by localinfer.system.buffers.parse_buffer_report.
        self.memory_log = tuple(t for _, t in log.since(log_start) if "buffer size =" in t or "offloaded" in t)
        self._mem = llama_cpp.llama_get_memory(ctx)
        self.n_ctx = int(llama_cpp.llama_n_ctx(ctx))
        self.n_ctx_seq = int(llama_cpp.llama_n_ctx_seq(ctx))
        self.n_seq_max = int(llama_cpp.llama_n_seq_max(ctx))
        self.n_batch = int(cparams.n_batch)
        self.n_threads = int(cparams.n_threads)
        self.n_threads_batch = int(cparams.n_threads_batch)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.load_s = time.perf_counter() - t0
        self._outs: dict[int, tuple[bytes, str | None, bool]] = {}  # see token_out
        self._piece_buf = ctypes.create_string_buffer(256)
        self._one = (llama_cpp.llama_token * 1)()
        self._one_batch = llama_cpp.llama_batch_get_one(self._one, 1)
        self._tokens: list[int] = []  # what sequence 0 holds in the KV cache, in order
        self.draft_model: Any = None  # engine.draft_model.DraftModel: guesses for speculative decoding

    # -- lifecycle ---------------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "draft_model", None) is not None:
            self.draft_model.close()
            self.draft_model = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ``sys.is_finalizing`` bound now: at shutdown module globals such as ``sys`` may already be None.
    def __del__(self, _finalizing: Any = sys.is_finalizing) -> None:  # pragma: no cover - best effort
        if _finalizing():  # the OS takes the memory back at exit, faster than freeing it piece by piece
            return
        try:
            self.close()
        except Exception:
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
    def bos_token(self) -> int:
        return int(llama_cpp.llama_vocab_bos(self._vocab))

    @property
    def bos_text(self) -> str:
        tok = self.bos_token
        return self.token_text(tok) if tok >= 0 else ""

    @property
    def eos_text(self) -> str:
        tok = llama_cpp.llama_vocab_eos(self._vocab)
        return self.token_text(tok) if tok >= 0 else ""

    @property
    def add_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    # -- the public face for several sequences (engine.batch) ---------------------------------------
    def new_sampler(self, opts: SamplingOptions, history: Sequence[int], constraint: Any = None) -> tuple[Any, int]:
        """A native sampler chain for one sequence, and its seed; free it with ``free_sampler``.
        ``constraint``: a :meth:`constraint_sampler` of its own."""
        return build_sampler(opts, self.n_vocab, history, self.n_ctx_seq, constraint)

    def constraint_sampler(self, fmt: Format, start_after: str | None = None) -> Any:
        """One sequence's sampler for ``fmt`` (compiled once per format; FormatError if it cannot be)."""
        from localinfer.engine.constrain import ConstraintSampler, compile_for

        return ConstraintSampler(compile_for(self, fmt), start_after, lambda t: self._piece(t, special=True))

    free_sampler = staticmethod(free_sampler)

    def new_logprobs(self, top_n: int) -> Logprobs:
        """A reader of each sampled token's log probabilities and its ``top_n`` alternatives."""
        return Logprobs(self._ctx, self.n_vocab, self.piece, top_n)

    def decode_batch(self, batch: Any) -> int:
        """``llama_decode`` on this model's context, finished (GPU backends run it asynchronously: see
        generate): 0 on success, 1 when the cache has no room."""
        rc = int(llama_cpp.llama_decode(self._ctx, batch))
        llama_cpp.llama_synchronize(self._ctx)
        return rc

    def set_threads(self, n_threads: int, n_threads_batch: int) -> None:
        """Decode with these threads from the next decode on (``serve.cores``: a core for a load)."""
        llama_cpp.llama_set_n_threads(self._ctx, n_threads, n_threads_batch)

    def sample(self, chain: Any, index: int) -> int:
        """Sample from the logits of batch row ``index`` (-1: the last row)."""
        return int(llama_cpp.llama_sampler_sample(chain, self._ctx, index))

    def drop_sequence(self, seq: int) -> None:
        """Free every KV cell of sequence ``seq``."""
        llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)

    def drop_tokens(self, seq: int, start: int) -> bool:
        """Free ``seq``'s cells from position ``start`` on; False where the cache cannot (recurrent)."""
        return bool(llama_cpp.llama_memory_seq_rm(self._mem, seq, start, -1))

    def first_position(self, seq: int) -> int:
        """The lowest position ``seq`` still holds (> 0 once a sliding window forgot old cells; -1: empty)."""
        return int(llama_cpp.llama_memory_seq_pos_min(self._mem, seq))

    # -- KV cache of sequence 0 ----------------------------------------------------------------------
    @property
    def cached_tokens(self) -> list[int]:
        return list(self._tokens)

    def reset(self) -> None:
        """Forget everything in the KV cache (a new conversation)."""
        llama_cpp.llama_memory_clear(self._mem, True)
        self._tokens = []

    def keep_prefix(self, n: int) -> int:
        """Keep only the first ``n`` cached tokens; returns how many are kept (0 where the cache
        cannot drop a suffix). A chat /retry uses it to evaluate its prompt as the first answer did."""
        if n < len(self._tokens):
            if n <= 0 or not llama_cpp.llama_memory_seq_rm(self._mem, 0, n, -1):
                # Some caches (e.g. sliding-window attention) cannot drop a suffix: start over.
                self.reset()
            else:
                del self._tokens[n:]
        return len(self._tokens)

    def _reuse_prefix(self, prompt: Sequence[int]) -> int:
        """Keep the longest cached prefix of ``prompt`` (at least one token is left to evaluate)."""
        n = 0
        limit = min(len(self._tokens), len(prompt) - 1)
        cached = self._tokens
        while n < limit and cached[n] == prompt[n]:
            n += 1
        return self.keep_prefix(n)

    def _decode(self, tokens: Sequence[int]) -> None:
        """Evaluate ``tokens`` on sequence 0, in batches of at most n_batch."""
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            arr = (llama_cpp.llama_token * len(chunk))(*chunk)
            rc = llama_cpp.llama_decode(self._ctx, llama_cpp.llama_batch_get_one(arr, len(chunk)))
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

    # -- generation ----------------------------------------------------------------------------------
    def generate(
        self,
        prompt: Sequence[int],
        sampling: SamplingOptions,
        stats: GenerationStats,
        *,
        max_tokens: int | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        constraint: Format | None = None,
        constraint_after: str | None = None,
        logprobs: int | None = None,
    ) -> Iterator[Step]:
        """Evaluate ``prompt`` (reusing the cached prefix) and stream the answer.
        ``constraint``: the answer is this JSON / grammar (from ``constraint_after`` on, if given);
        a format that cannot be compiled raises FormatError before anything is evaluated.
        ``logprobs``, the top N: every counted token's in ``stats.logprobs``.

        ``stats`` is filled in as the stream goes, so a consumer that stops early still has
        correct figures. The last token sampled is not evaluated (nobody needs its logits).
        """
        if not prompt:
            raise GenerationError("empty prompt: nothing to evaluate")
        t_start = time.perf_counter()
        stats.n_ctx = self.n_ctx
        stats.prompt_tokens = len(prompt)
        stats.finish_reason = None
        limiter = self.constraint_sampler(constraint, constraint_after) if constraint is not None else None
        try:
            cached = self._reuse_prefix(prompt)
            t0 = time.perf_counter()
            evaluate = getattr(prompt, "evaluate", None)  # engine.vision.MediaPrompt: images among the tokens
            if evaluate is not None:
                cached = evaluate(self, cached, stats)
                t0 += stats.image_encode_s  # encoding is timed apart from prefill
                prompt = prompt.history
            else:
                self._decode(prompt[cached:])
            stats.cached_tokens = cached
            # GPU backends (CUDA, Metal, RPC) compute asynchronously: llama_decode returns when the
            # work is queued, so the time is taken once it is done (on the CPU this costs nothing)
            llama_cpp.llama_synchronize(self._ctx)
            stats.prefill_s = time.perf_counter() - t0
            chain, seed = build_sampler(sampling, self.n_vocab, prompt, self.n_ctx, limiter)
            stats.extra["seed"] = seed
            lp = self.new_logprobs(logprobs) if logprobs is not None else None
            try:
                if self.options.draft is not None or self.draft_model is not None:  # speculative decoding (engine/speculate.py)
                    from localinfer.engine.speculate import speculative_loop

                    yield from speculative_loop(self, chain, stats, t_start, max_tokens, stop, ignore_eos, lp, limiter, prompt)
                else:
                    yield from self._sample_loop(chain, stats, t_start, max_tokens, stop, ignore_eos, lp)
            finally:
                if limiter is not None:
                    stats.document = "complete" if limiter.complete else "incomplete"
                free_sampler(chain)
                if lp is not None:
                    stats.logprobs = lp.entries()
        except (KeyboardInterrupt, GeneratorExit):
            stats.finish_reason = stats.finish_reason or "interrupted"
            self._resync()
            raise
        finally:
            stats.context_used = len(self._tokens)

    def _sample_loop(
        self,
        chain: Any,
        stats: GenerationStats,
        t_start: float,
        max_tokens: int | None,
        stop: Sequence[str],
        ignore_eos: bool,
        lp: Logprobs | None = None,
    ) -> Iterator[Step]:
        # The per-token path: it runs with the CPU caches just flushed by llama_decode, so it touches
        # little - one dict lookup per token, the decoder and stop matcher only when a piece needs them.
        sample, decode, sync = llama_cpp.llama_sampler_sample, llama_cpp.llama_decode, llama_cpp.llama_synchronize
        ctx, one, batch, cached = self._ctx, self._one, self._one_batch, self._tokens
        outs, learn = self._outs, self.token_out
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        held = False  # the decoder holds the first bytes of a character split across tokens
        matcher = StopMatcher(stop)
        clock = time.perf_counter
        n_ctx = self.n_ctx
        limit = max_tokens if max_tokens is not None else n_ctx + 1
        n_gen = 0
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
                break
            n_gen += 1
            stats.completion_tokens = n_gen
            stats.decode_s = now - t_first
            if lp is not None:  # before the next llama_decode overwrites the row
                lp.add(-1, token)
            if text is None or held:
                text = decoder.decode(raw)
                held = bool(decoder.getstate()[0])
            text, hit = matcher.feed(text)
            if text or hit:
                yield Step(text, token)
            if hit:
                stats.finish_reason, stats.stop_string = "stop", matcher.matched
                return
            if n_gen >= limit or len(cached) >= n_ctx:
                stats.finish_reason = "length"
                break
            one[0] = token
            t_call = clock()
            rc = decode(ctx, batch)
            sync(ctx)  # the work itself, not its queueing (see generate); sampling would wait for it anyway
            stats.decode_calls_s += clock() - t_call
            if rc != 0:
                self._decode_failed(rc)
            cached.append(token)
        tail = matcher.flush() + decoder.decode(b"", final=True)
        if tail:
            yield Step(tail, None)
