"""Embeddings: a context of its own beside a LlamaModel's generation context (the same llama_model, so
the weights are loaded once), many inputs per ``llama_decode``, pooled by llama.cpp and read per
sequence (``llama_get_embeddings_seq``).

Not ``Llama.embed``: it truncates to n_batch, clears the KV cache it shares with generation, and
its rerank path reads past llama.cpp's output. The context here is made with ``embeddings=True``, a
unified KV cache (sequences of any lengths share its cells) and ``n_batch == n_ubatch``: llama.cpp
pools each ubatch on its own and keeps the last ubatch's result for a sequence, so a sequence must
be decoded in one ubatch - its longest input is ``n_batch`` tokens, as llama-server's is ``-ub``.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Sequence

from localinfer.engine.backend import interruptible, llama_cpp, stdout_to_stderr
from localinfer.engine.model import LlamaModel
from localinfer.engine.params import context_params
from localinfer.errors import ContextOverflowError, GenerationError, ModelLoadError, UsageError

POOLINGS = {"mean": 1, "cls": 2, "last": 3}  # enum llama_pooling_type
DEFAULT_CTX = 512  # tokens per llama_decode, and so the longest input (llama-server's default -ub)
DEFAULT_SEQS = 64  # inputs per llama_decode at most


def gguf_pooling(model: LlamaModel) -> str | None:
    """The pooling the GGUF names (``<arch>.pooling_type``), where it is one we can read back."""
    arch = model.meta("general.architecture")
    raw = model.meta(f"{arch}.pooling_type") if arch else None
    by_id = {str(v): k for k, v in POOLINGS.items()}
    return by_id.get((raw or "").strip())


def l2_normalized(vec: list[float]) -> list[float]:
    """``vec / |vec|`` (llama.cpp's common_embd_normalize with 2); a zero vector stays zero."""
    norm = math.sqrt(math.fsum(x * x for x in vec))
    if norm <= 0.0:
        return vec
    scale = 1.0 / norm
    return [x * scale for x in vec]


def embedding_size(model: LlamaModel) -> int:
    """The length of the model's pooled vectors."""
    return int(llama_cpp.llama_model_n_embd_out(model._model))


def input_tokens(model: LlamaModel, item: str | Sequence[int], max_tokens: int, *, truncate: bool = False) -> tuple[list[int], int]:
    """An input's tokens (a text is tokenized as llama-server does: special tokens added and parsed)
    and how many were cut off its end with ``truncate``; one longer than ``max_tokens`` is an error
    naming its length, an empty one or a token out of the vocabulary a UsageError. Any thread."""
    if isinstance(item, str):
        tokens = model.tokenize(item, add_special=True, parse_special=True)
    else:
        tokens = list(item)
        n_vocab = model.n_vocab
        bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise UsageError(f"token id {bad} is out of the vocabulary ({n_vocab} tokens)")
    if not tokens:
        raise UsageError("the input is empty: nothing to embed")
    dropped = max(0, len(tokens) - max_tokens)
    if dropped and not truncate:
        raise ContextOverflowError(
            f"the input is {len(tokens)} tokens; the embedding context holds {max_tokens}",
            hint="raise the embedding context size, or truncate the input",
        )
    return tokens[:max_tokens], dropped


class Embedder:
    """An embedding context on ``model``; ``n_ctx``: tokens per decode (the longest input; default
    512, at most the trained context), ``pooling``: mean | cls | last (default: the GGUF's, else mean)."""

    def __init__(self, model: LlamaModel, *, n_ctx: int | None = None, pooling: str | None = None, n_seq_max: int = DEFAULT_SEQS) -> None:
        if pooling is not None and pooling not in POOLINGS:
            raise UsageError(f"pooling must be one of {', '.join(POOLINGS)}, not {pooling!r}")
        if model.closed:
            raise GenerationError("the model is closed")
        self.model = model
        self.pooling = pooling or gguf_pooling(model) or "mean"
        n = n_ctx or min(DEFAULT_CTX, model.n_ctx_train or DEFAULT_CTX)
        cparams = context_params(model.options, n)  # the model's threads, flash attention, cache types
        cparams.n_batch = cparams.n_ubatch = n
        cparams.n_seq_max = max(1, min(n_seq_max, n))
        cparams.kv_unified = True
        cparams.embeddings = True
        cparams.pooling_type = POOLINGS[self.pooling]
        handle = model._model  # engine-internal: the llama_model both contexts share
        with stdout_to_stderr():
            ctx = interruptible(lambda: llama_cpp.llama_init_from_model(handle, cparams), free=llama_cpp.llama_free)
        if not ctx:
            raise ModelLoadError(f"llama.cpp could not create an embedding context of {n} tokens", hint="try a smaller context")
        self._ctx = ctx
        self.max_tokens = int(llama_cpp.llama_n_batch(ctx))
        self.n_seq_max = int(llama_cpp.llama_n_seq_max(ctx))
        self.n_embd = embedding_size(model)
        self._mem = llama_cpp.llama_get_memory(ctx)
        cap = self.max_tokens
        self._batch = b = llama_cpp.llama_batch_init(cap, 0, 1)
        self._tok = (llama_cpp.llama_token * cap).from_address(ctypes.addressof(b.token.contents))
        self._pos = (llama_cpp.llama_pos * cap).from_address(ctypes.addressof(b.pos.contents))
        (ctypes.c_int8 * cap).from_address(ctypes.addressof(b.logits.contents))[:] = b"\x01" * cap  # pooling reads every row
        (ctypes.c_int32 * cap).from_address(ctypes.addressof(b.n_seq_id.contents))[:] = [1] * cap
        self._seq = [(llama_cpp.llama_seq_id * 1).from_address(ctypes.addressof(b.seq_id[i].contents)) for i in range(cap)]

    # -- lifecycle ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Free the context (before the model it was made on)."""
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tokens_of(self, item: str | Sequence[int], *, truncate: bool = False) -> tuple[list[int], int]:
        return input_tokens(self.model, item, self.max_tokens, truncate=truncate)

    # -- the work -------------------------------------------------------------------------------------
    def embed(
        self, inputs: Sequence[Sequence[int]], *, normalize: bool = True, on_done: Callable[[int], None] | None = None
    ) -> list[list[float]]:
        """One vector per input (token lists from :meth:`tokens_of`), in order: as many inputs per
        ``llama_decode`` as fit ``max_tokens`` and ``n_seq_max``. ``on_done(n)``: n more are done."""
        if self._ctx is None:
            raise GenerationError("this embedder is closed")
        for tokens in inputs:
            if not 0 < len(tokens) <= self.max_tokens:
                raise ContextOverflowError(f"an input of {len(tokens)} tokens does not fit the embedding context ({self.max_tokens})")
        out: list[list[float]] = []
        first, count = 0, len(inputs)
        while first < count:
            end, n = self.batch_end(inputs, first), 0
            for i in range(first, end):
                n = self._put(inputs[i], n, i - first)
            out.extend(self._decode(n, end - first, normalize))
            if on_done is not None:
                on_done(end - first)
            first = end
        return out

    def batch_end(self, inputs: Sequence[Sequence[int]], first: int) -> int:
        """Where the inputs one ``llama_decode`` takes from ``first`` end (at least one more input):
        as many as fit ``max_tokens`` and ``n_seq_max``."""
        i, n = first, 0
        while i < len(inputs) and i - first < self.n_seq_max and n + len(inputs[i]) <= self.max_tokens:
            n += len(inputs[i])
            i += 1
        return max(i, min(first + 1, len(inputs)))

    def _put(self, tokens: Sequence[int], n: int, seq: int) -> int:
        """Put one input at batch row ``n`` as sequence ``seq``; the next free row."""
        k = len(tokens)
        end = n + k
        self._tok[n:end] = tokens
        self._pos[n:end] = range(k)
        rows = self._seq
        for r in range(n, end):
            rows[r][0] = seq
        return end

    def _decode(self, n_tokens: int, n_seqs: int, normalize: bool) -> list[list[float]]:
        self._batch.n_tokens = n_tokens
        llama_cpp.llama_memory_clear(self._mem, True)  # each batch starts from an empty cache
        rc = int(llama_cpp.llama_decode(self._ctx, self._batch))
        llama_cpp.llama_synchronize(self._ctx)
        if rc != 0:
            llama_cpp.llama_memory_clear(self._mem, True)
            raise GenerationError(f"llama_decode failed with code {rc} on a batch of {n_seqs} inputs ({n_tokens} tokens)")
        vectors = []
        for s in range(n_seqs):
            ptr = llama_cpp.llama_get_embeddings_seq(self._ctx, s)
            if not ptr:
                raise GenerationError(f"llama.cpp returned no embedding for sequence {s}")
            vec = ptr[: self.n_embd]
            vectors.append(l2_normalized(vec) if normalize else vec)
        return vectors
