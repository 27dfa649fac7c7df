"""Images into a loaded model, through libmtmd: a :class:`Projector` (the model's mmproj GGUF) turns a
rendered prompt whose text holds image markers into a :class:`MediaPrompt`, which
``LlamaModel.run`` evaluates like prompt tokens (images encoded, their embeddings decoded in place).

Checked before anything can abort the process: the projector is libmtmd's to refuse at load (its
width against the model's: we turn its log line into the error), and every text token libmtmd's
tokenizer emits must be in the model's vocabulary - a projector whose marker tokens the model lacks
(an idefics3 projector on a model without ``<fake_token_around_image>``) makes it emit -1, on which
``llama_decode`` would assert. libmtmd's log goes to our log callback (quiet unless verbose).
"""

from __future__ import annotations

import ctypes
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer.engine.backend import ensure_backend, interruptible, llama_cpp, stdout_to_stderr
from localinfer.engine.bindings import mtmd_bindings
from localinfer.errors import GenerationError, ModelLoadError, UsageError

if TYPE_CHECKING:
    from localinfer.engine.model import LlamaModel
    from localinfer.engine.types import GenerationStats
    from localinfer.request.images import Image

CHUNK_TEXT, CHUNK_IMAGE = 0, 1
_NO_CALLBACK: Any = None  # mtmd_helper_decode_image_chunk's post-decode callback: a null one, made once


def _no_callback(mt: Any) -> Any:
    global _NO_CALLBACK
    if _NO_CALLBACK is None:
        _NO_CALLBACK = ctypes.cast(None, mt.mtmd_helper_post_decode_callback)
    return _NO_CALLBACK


class Projector:
    """A multimodal projector loaded for ``model`` (freed with ``close``, before the model)."""

    def __init__(self, model: LlamaModel, path: str | Path, *, n_threads: int | None = None, use_gpu: bool = True,
                 verbose: bool = False) -> None:  # fmt: skip
        self.mt = mt = mtmd_bindings()
        self.model = model
        self.path = Path(path)
        self._ctx: Any = None
        log = ensure_backend(verbose)
        mt.mtmd_log_set(log._callback, None)  # one callback for llama.cpp's log and libmtmd's
        mt.mtmd_helper_log_set(log._callback, None)
        start = log.seq
        params = mt.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.print_timings = False
        params.warmup = False  # the first image pays for the graph; a load that may never see one does not
        params.n_threads = n_threads or model.n_threads_batch
        t0 = time.perf_counter()
        with stdout_to_stderr():
            ctx = interruptible(lambda: mt.mtmd_init_from_file(str(self.path).encode("utf-8"), model._model, params), free=mt.mtmd_free)
        if not ctx:
            raise _load_error(self.path, model, [t for _, t in log.since(start)] + list(log.lines)[-20:])
        self._ctx = ctx
        if not mt.mtmd_support_vision(ctx):
            self.close()
            raise ModelLoadError(f"projector {self.path.name} takes no images (an audio projector?)")
        self.load_s = time.perf_counter() - t0
        self.marker = (mt.mtmd_default_marker() or b"<__media__>").decode()
        self.mrope = bool(mt.mtmd_decode_use_mrope(ctx))
        self.n_embd = int(llama_cpp.llama_model_n_embd_inp(model._model))  # floats per image token

    def close(self) -> None:
        if self._ctx:
            self.mt.mtmd_free(self._ctx)
            self._ctx = None

    def prompt(self, text: str, images: Sequence[Image], *, add_special: bool = True) -> MediaPrompt:
        """Tokenize ``text`` (special tokens parsed, as for a rendered chat) with ``images`` at its markers."""
        mt = self.mt
        if text.count(self.marker) != len(images):
            raise UsageError(f"the prompt places {text.count(self.marker)} images but {len(images)} were given")
        bitmaps = []
        chunks = mt.mtmd_input_chunks_init()
        try:
            for img in images:
                px = img.pixels()  # decoded here, the request's bounds and the projector checked before
                if len(px.rgb) != px.width * px.height * 3:
                    raise UsageError(f"image {img.name}: {len(px.rgb)} bytes are not {px.width}x{px.height} RGB")
                buf = (ctypes.c_uint8 * len(px.rgb)).from_buffer_copy(px.rgb)
                bm = mt.mtmd_bitmap_init(px.width, px.height, buf)
                if not bm:
                    raise UsageError(f"image {img.name} could not be handed to libmtmd")
                bitmaps.append(bm)
                if img.sha256:
                    mt.mtmd_bitmap_set_id(bm, img.sha256.encode())
            data = text.encode("utf-8")
            inp = mt.mtmd_input_text(data, len(data), add_special, True)
            arr = (mt.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            rc = mt.mtmd_tokenize(self._ctx, chunks, ctypes.byref(inp), arr, len(bitmaps))
            if rc != 0:
                what = "the images do not match the prompt's markers" if rc == 1 else "an image could not be preprocessed"
                raise UsageError(f"libmtmd could not tokenize the prompt: {what}")
            out = MediaPrompt(self, chunks, images)
            chunks = None  # the prompt owns them now
            return out
        finally:
            for bm in bitmaps:
                mt.mtmd_bitmap_free(bm)
            if chunks is not None:
                mt.mtmd_input_chunks_free(chunks)


def _load_error(path: Path, model: LlamaModel, lines: list[str]) -> Exception:
    text = "".join(lines)
    m = re.search(r"mismatch between text model \(n_embd = (\d+)\) and mmproj \(n_embd = (\d+)\)", text)
    if m:
        return UsageError(f"projector {path.name} gives {m.group(2)}-wide embeddings but {model.path.name} takes "
                          f"{m.group(1)}: it belongs to another model", hint="use the projector made for this model")  # fmt: skip
    reason = next((ln.strip() for ln in reversed(lines) if "error" in ln.lower() or "failed" in ln.lower()), "")
    return ModelLoadError(f"cannot load projector {path.name}" + (f": {reason}" if reason else ""))


class MediaPrompt(list):
    """A prompt's positions as tokens (a list, for the KV-cache bookkeeping): text tokens, and for each
    image a placeholder per position (negative, from the image's hash: the same image at the same place
    is reused from the cache). ``history``: the text tokens alone (for samplers and drafting)."""

    def __init__(self, projector: Projector, chunks: Any, images: Sequence[Image]) -> None:
        mt = projector.mt
        self.projector, self._chunks = projector, chunks
        self.pieces: list[tuple[int, int, Any]] = []  # (start, n tokens, image chunk or None)
        self.pos_at: list[int] = []  # each piece's first position: M-RoPE's image takes max(rows, columns), not its tokens
        pos = 0
        tokens: list[int] = []
        n_vocab = projector.model.n_vocab
        self.image_tokens = 0
        try:
            for i in range(mt.mtmd_input_chunks_size(chunks)):
                chunk = mt.mtmd_input_chunks_get(chunks, i)
                kind = mt.mtmd_input_chunk_get_type(chunk)
                if kind == CHUNK_TEXT:
                    n = ctypes.c_size_t(0)
                    ptr = mt.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                    text = [int(ptr[j]) for j in range(n.value)]
                    bad = next((t for t in text if not 0 <= t < n_vocab), None)
                    if bad is not None:  # llama_decode would assert on it and abort the process
                        raise UsageError(f"projector {projector.path.name} needs marker tokens that "
                                         f"{projector.model.path.name}'s vocabulary lacks (token id {bad})",
                                         hint="use the projector made for this model")  # fmt: skip
                    self.pieces.append((len(tokens), len(text), None))
                    self.pos_at.append(pos)
                    pos += len(text)
                    tokens.extend(text)
                elif kind == CHUNK_IMAGE:
                    n_tok = int(mt.mtmd_input_chunk_get_n_tokens(chunk))
                    ident = (mt.mtmd_input_chunk_get_id(chunk) or b"").decode() or str(i)
                    self.pieces.append((len(tokens), n_tok, chunk))
                    self.pos_at.append(pos)
                    pos += int(mt.mtmd_input_chunk_get_n_pos(chunk))
                    tokens.extend([-2 - (hash((ident, len(tokens))) & 0x3FFFFFFF)] * n_tok)
                    self.image_tokens += n_tok
                else:
                    raise UsageError("the prompt holds media other than images (audio), which is not supported")
        except BaseException:
            self._chunks = None  # still the caller's to free (Projector.prompt)
            raise
        if not self.pieces or self.pieces[-1][2] is not None:
            self._chunks = None
            raise UsageError("the prompt ends with an image: text must follow it (the answer starts after)")
        super().__init__(tokens)
        self.shift = pos - len(tokens)  # a cell's position minus its index, after the last image (M-RoPE: < 0)
        self.history = [t for t in tokens if t >= 0]

    def close(self) -> None:
        if self._chunks is not None:
            self.projector.mt.mtmd_input_chunks_free(self._chunks)
            self._chunks = None

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    def evaluate(self, model: LlamaModel, cached: int, stats: GenerationStats) -> int:
        """Decode what sequence 0's cache lacks from position ``cached`` (moved back to an image's start
        if it falls inside one; the one sequence's path, model.run); images are encoded first, timed apart
        (``stats.image_encode_s``). Returns the positions kept from the cache."""
        stats.image_tokens = self.image_tokens
        for start, n, chunk in self.pieces:
            if chunk is not None and start < cached < start + n:
                cached = model.keep_prefix(start)
        if self.projector.mrope and cached:  # M-RoPE positions are not token counts: start over
            model.reset()
            cached = 0

        def text(tokens: list[int], pos: int) -> None:
            if pos == len(model._tokens):
                model._decode(tokens)
            else:  # after an M-RoPE image: its positions, then generation goes on from the last one
                _decode_seq(model, 0, tokens, pos, last_logits=True)
                model._tokens.extend(tokens)

        def image(start: int, end: int) -> None:
            model._tokens.extend(self[start:end])

        stats.image_encode_s += self._run(model, 0, cached, len(self), text, image)
        return cached

    def start_seq(self, model: LlamaModel, seq: int, cached: int) -> int:
        """The batch engine's, as a slot is admitted: of the ``cached`` positions sequence ``seq``
        holds, those kept (moved back to an image's start if it falls inside one - or after one, with
        M-RoPE's positions, which are not the cells' indices that dropping cells goes by)."""
        for start, n, chunk in self.pieces:
            if chunk is not None and start < cached and (cached < start + n or self.shift):
                cached = start if model.drop_tokens(seq, start) else 0
                if not cached:
                    model.drop_sequence(seq)
        return cached

    def images_from(self, cached: int) -> list[Any]:
        """The image chunks that a sequence holding the first ``cached`` positions still needs."""
        return [chunk for start, n, chunk in self.pieces if chunk is not None and start + n > cached]

    def decode_seq(self, model: LlamaModel, seq: int, cached: int, embds: Sequence[Any]) -> int:
        """The batch engine's (engine thread), once ``images_from(cached)`` are encoded (``embds``, in
        order: engine/vision_encode.py): decode all but the last position into sequence ``seq``, so
        that the slot evaluates the last text token as any prompt's. Returns the positions now held."""
        left = iter(embds)

        def text(tokens: list[int], pos: int) -> None:
            _decode_seq(model, seq, tokens, pos)

        self._run(model, seq, cached, len(self) - 1, text, lambda _s, _e: None, lambda _p, _c: (next(left), 0.0))
        return len(self) - 1

    def _run(self, model: LlamaModel, seq: int, cached: int, upto: int, text: Any, image: Any, encoded: Any = None) -> float:
        """Decode positions ``cached`` to ``upto``: text pieces through ``text(tokens, pos)``, images
        encoded (``encoded(chunk)``: their embeddings and seconds; else here) and decoded here (then
        ``image(start, end)``); the time spent encoding."""
        pr = self.projector
        encode_s = 0.0
        for (start, n, chunk), pos in zip(self.pieces, self.pos_at):
            end = min(start + n, upto)
            if end <= cached or start >= upto:
                continue
            if chunk is None:
                first = max(start, cached)
                text(list(self[first:end]), pos + first - start)
                continue
            embd, spent = (encoded or encode)(pr, chunk)
            encode_s += spent
            decode_image(pr, model, chunk, embd, pos, seq)
            image(start, start + n)
        return encode_s


def encode(projector: Projector, chunk: Any) -> tuple[Any, float]:
    """Encode an image chunk: libmtmd's output buffer (overwritten by the next encode), and the seconds."""
    mt = projector.mt
    t0 = time.perf_counter()
    if mt.mtmd_encode_chunk(projector._ctx, chunk) != 0:
        raise GenerationError("libmtmd could not encode an image")
    return mt.mtmd_get_output_embd(projector._ctx), time.perf_counter() - t0


def encode_copy(projector: Projector, chunk: Any) -> tuple[Any, float]:
    """:func:`encode`, its embeddings copied out of libmtmd's buffer (an encode off the engine thread)."""
    embd, spent = encode(projector, chunk)
    n = int(projector.mt.mtmd_input_chunk_get_n_tokens(chunk)) * projector.n_embd
    out = (ctypes.c_float * n)()
    ctypes.memmove(out, embd, n * ctypes.sizeof(ctypes.c_float))
    return out, spent


def decode_image(projector: Projector, model: LlamaModel, chunk: Any, embd: Any, start: int, seq: int) -> None:
    """Decode an encoded image's embeddings at positions ``start``... of sequence ``seq`` (libmtmd's helper)."""
    mt = projector.mt
    new_past = llama_cpp.llama_pos(0)
    rc = mt.mtmd_helper_decode_image_chunk(projector._ctx, model._ctx, chunk, embd, start, seq, model.n_batch,
                                           ctypes.byref(new_past), _no_callback(mt), None)  # fmt: skip
    if rc != 0:
        if seq == 0:
            model._decode_failed(rc)
        raise GenerationError(f"decoding an image failed (code {rc})")


def _decode_seq(model: LlamaModel, seq: int, tokens: list[int], pos: int, last_logits: bool = False) -> None:
    """Evaluate ``tokens`` at positions ``pos``... of sequence ``seq``, n_batch at a time (no logits
    but, with ``last_logits``, the last token's)."""
    for off in range(0, len(tokens), model.n_batch):
        part = tokens[off : off + model.n_batch]
        batch = llama_cpp.llama_batch_init(len(part), 0, 1)
        try:
            for i, tok in enumerate(part):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos + off + i, 1, 0
                batch.seq_id[i][0] = seq
            batch.n_tokens = len(part)
            if last_logits and off + len(part) == len(tokens):
                batch.logits[len(part) - 1] = 1
            rc = model.decode_batch(batch)
        finally:
            llama_cpp.llama_batch_free(batch)
        if rc != 0:
            raise GenerationError(f"llama_decode failed with code {rc}")
