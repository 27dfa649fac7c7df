"""A GGUF model loaded into llama.cpp (through llama-cpp-python's low-level bindings; process-wide
state and machine facts are in ``engine.backend``): its facts and the face several sequences use
(engine.batch); one sequence's cache and generation are its base ``engine.single.SingleSequence``.

We drive llama.cpp directly - one batch per decode, the native sampler chain, our own KV-cache
bookkeeping - instead of going through ``llama_cpp.Llama``: it keeps the per-token overhead near
zero, lets us time prefill and decode exactly, and reuse the cache across chat turns.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer.engine.backend import ensure_backend, interruptible, llama_cpp, stdout_to_stderr
from localinfer.engine.load_errors import diagnose_load_failure
from localinfer.engine.logprobs import Logprobs
from localinfer.engine.params import context_params, model_params
from localinfer.engine.sampling import build_sampler, free_sampler
from localinfer.engine.single import SingleSequence
from localinfer.engine.vocab import Vocab
from localinfer.engine.types import DEFAULT_CTX_CEILING, LoadOptions
from localinfer.request.sampling import SamplingOptions

if TYPE_CHECKING:
    from localinfer.request.structured import Format


class LlamaModel(Vocab, SingleSequence):
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
        self.n_ubatch = int(cparams.n_ubatch)
        # a cell per token, dropped from any position (not a recurrent or hybrid model's running state)
        self.per_token_cells = not (llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model))
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

    def __enter__(self) -> LlamaModel:
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
        return self.token_bytes(token).decode("utf-8", errors="replace")

    def token_bytes(self, token: int) -> bytes:
        """A token's bytes, special tokens written out (a character may span two tokens' bytes)."""
        return self._piece(token, special=True)

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
        """Decode with these threads from the next decode on (``serve.models.cores``: a core for a load)."""
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

    def save_sequence(self, seq: int) -> bytearray:
        """``seq``'s KV cells as llama.cpp writes a sequence's state (engine.prompt_cache keeps them in
        host memory); empty where it cannot."""
        size = int(llama_cpp.llama_state_seq_get_size(self._ctx, seq))
        data = bytearray(size)
        if size:
            written = int(llama_cpp.llama_state_seq_get_data(self._ctx, (ctypes.c_uint8 * size).from_buffer(data), size, seq))
            del data[written:]
        return data

    def restore_sequence(self, seq: int, data: bytearray) -> bool:
        """Put cells ``save_sequence`` wrote back, into the empty sequence ``seq``; False where llama.cpp
        could not (then ``seq`` is left empty)."""
        n = len(data)
        read = int(llama_cpp.llama_state_seq_set_data(self._ctx, (ctypes.c_uint8 * n).from_buffer(data), n, seq)) if n else 0
        if read != n or read == 0:
            self.drop_sequence(seq)
            return False
        return True
