"""Constrained decoding: a :class:`~localinfer.request.structured.Format` compiled for a loaded model, and
the sampler that enforces it inside the native chain (engine/sampling.py puts it there).

The mechanism is llguidance (Microsoft's Rust grammar engine, used by vLLM, SGLang and llama.cpp's
``--llguidance`` build), chosen by measurement (benchmarks/results/constraint_cost.md) over
llama.cpp's own grammar sampler and xgrammar:

* coverage: it compiles JSON Schema itself, with integer/number bounds, ``format``, ``pattern``,
  recursive ``$ref`` and ``prefixItems``, and in its strict mode refuses a keyword it would not enforce
  (llama-cpp-python's GBNF converter ignores unknown keywords and integer bounds);
* per-token cost: the mask comes from a token trie walked in Rust (tens of microseconds on a 49k
  vocabulary, still under a millisecond on Gemma's 262k), where llama.cpp's grammar sampler tests
  every candidate token against its stacks;
* start-up: a schema compiles in about a millisecond; the model's tokenizer is built once per loaded
  model (under a second on 262k tokens) and kept.

A sequence's sampler computes the mask before the other samplers run (it sits first in the chain,
on the whole vocabulary), applies it (ConstraintSampler says how), and advances its matcher when the
chain accepts a token. End of generation is allowed only where the document is complete, and once it
is complete nothing else is; so the answer ends right after the document. In a batch, the masks of
the next step are computed while llama_decode runs, where that leaves CPU free (MaskPrefetch).

Bounds: request/structured.py bounds the schema's size and depth; llguidance's parser limits (below) bound
the lexer's states and the work of one mask, so a pathological schema fails instead of hanging.
"""

from __future__ import annotations

import codecs
import ctypes
import json
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from localinfer.engine.backend import llama_cpp
from localinfer.request.structured import Format, FormatError, gbnf_to_lark

CACHE_SIZE = 64  # compiled formats kept per loaded model...
CACHE_TEXT_BYTES = 4 << 20  # ...and their text at most: a matcher's memory grows with its grammar's size
# JSON is compact (no free whitespace): a small model cannot wander into endless blank space.
JSON_OPTIONS = {"whitespace_flexible": False, "lenient": False}
ANY_OBJECT = '{"type": "object"}'


def _limits() -> Any:
    import llguidance

    # llguidance's defaults, with the lexer's states (1-2 kB each) capped at 100k: ~200 MB at worst
    return llguidance.LLParserLimits(max_lexer_states=100_000, verbose_errors=False)


@dataclass(frozen=True)
class Compiled:
    """A format ready for one model: a template matcher that each sequence copies."""

    fmt: Format
    matcher: Any  # llguidance.LLMatcher, never advanced itself
    n_vocab: int


class Compiler:
    """One loaded model's tokenizer for llguidance and its cache of compiled formats."""

    def __init__(self, tokenizer: Any, n_vocab: int) -> None:
        self.tokenizer, self.n_vocab = tokenizer, n_vocab  # llguidance's LLTokenizer (any, in tests)
        self._cache: OrderedDict[tuple[str, str], Compiled] = OrderedDict()
        self._text_bytes = 0  # of the formats in the cache
        self._lock = threading.Lock()

    def compile(self, fmt: Format) -> Compiled:
        key = (fmt.kind, fmt.text)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        compiled = Compiled(fmt, self._matcher(fmt), self.n_vocab)
        with self._lock:
            if key not in self._cache:  # (another thread may have compiled it meanwhile)
                self._text_bytes += len(fmt.text)
            self._cache[key] = compiled
            while len(self._cache) > 1 and (len(self._cache) > CACHE_SIZE or self._text_bytes > CACHE_TEXT_BYTES):
                _key, old = self._cache.popitem(last=False)  # the least recently used
                self._text_bytes -= len(old.fmt.text)
        return compiled

    def _matcher(self, fmt: Format) -> Any:
        from llguidance import LLMatcher

        # the schema with its numbers' digits bounded (engine/numbers.py) first; where that bound
        # makes it fail or unsatisfiable (e.g. an allOf whose other branch needs more), the schema as given
        error = ""
        for bound in (True, False) if fmt.kind == "json_schema" else (False,):
            try:
                grammar = grammar_of(fmt, bound)
            except FormatError as exc:
                error = str(exc)
                continue
            matcher = LLMatcher(self.tokenizer, grammar, log_level=0, limits=_limits())
            if matcher.is_error():  # its first line names the problem; the rest quotes the grammar
                first = (matcher.get_error() or "").strip().splitlines() or ["unknown error"]
                error = f"cannot compile the {_what(fmt)}: {_one_line(first[0])}"
                continue
            probe = matcher.deep_copy()  # its first mask: an error, or no token, means nothing can match
            if not any(probe.compute_bitmask()) or probe.is_error():
                error = f"nothing can satisfy the {_what(fmt)}"
                continue
            return matcher
        raise FormatError(error)


def _tokenizer(model: Any) -> Any:
    """llguidance's tokenizer for a loaded model: llguidance.llamacpp.lltokenizer_from_vocab, without
    its deprecated per-token call (a warning each, 49k of them), and with every end-of-turn token."""
    from llguidance import LLTokenizer

    vocab, control = model._vocab, llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
    user = llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
    buf = ctypes.create_string_buffer(16 * 1024)
    tokens = []
    for t in range(model.n_vocab):
        n = llama_cpp.llama_token_to_piece(vocab, t, buf, len(buf) - 1, 0, True)
        piece = ctypes.string_at(buf, max(n, 0))
        attr = llama_cpp.llama_vocab_get_attr(vocab, t)
        # llguidance's mark of a special token (it never matches grammar text)
        if attr & control or (attr & user and piece.startswith(b"<") and piece.endswith(b">")):
            piece = b"\xff" + piece
        tokens.append(piece)
    eog = sorted({t for t in (llama_cpp.llama_vocab_eos(vocab), llama_cpp.llama_vocab_eot(vocab)) if t >= 0})
    tokenize = ctypes.cast(llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
    return LLTokenizer.from_llamacpp(tokens=tokens, vocab_ptr=vocab, tokenize_fptr=tokenize, eos_token=eog or None)


def grammar_of(fmt: Format, bound: bool = False) -> str:
    """llguidance's grammar text for a format (JSON schema, or Lark from the GBNF); ``bound``: with
    the schema's unbounded numbers bounded (engine/numbers.py)."""
    from llguidance import LLMatcher

    if fmt.kind == "grammar":
        return LLMatcher.grammar_from_lark(fmt.lark or gbnf_to_lark(fmt.text))
    schema = ANY_OBJECT if fmt.kind == "json" else fmt.text
    if bound and fmt.kind == "json_schema":
        from localinfer.engine.numbers import bounded

        schema = json.dumps(bounded(json.loads(schema)), ensure_ascii=False)
    try:
        return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except ValueError as exc:
        raise FormatError(f"cannot compile the JSON schema: {_one_line(str(exc))}") from None


def _what(fmt: Format) -> str:
    return "grammar" if fmt.kind == "grammar" else "JSON schema"


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


_compilers: weakref.WeakKeyDictionary[Any, Compiler] = weakref.WeakKeyDictionary()
_compilers_lock = threading.Lock()


def compile_for(model: Any, fmt: Format) -> Compiled:
    """``fmt`` compiled for ``model`` (the tokenizer and the compiled format are cached)."""
    with _compilers_lock:
        compiler = _compilers.get(model)
        if compiler is None:
            compiler = _compilers[model] = Compiler(_tokenizer(model), model.n_vocab)
    return compiler.compile(fmt)


# -- the sampler ------------------------------------------------------------------------------------
_BIT = np.arange(32, dtype=np.uint32)
_FEW_WORDS = 64  # up to this many words of a mask, its tokens are read from those words alone


class ConstraintSampler:
    """One sequence's constraint as a native ``llama_sampler`` (its callbacks kept alive here).

    ``start_after``: the constraint is inactive until the sampled text has passed this marker (the end
    of a reasoning block); ``piece(token) -> bytes`` gives that text.

    The mask goes onto the candidates by whichever side of it is smaller (from the bitmask's words,
    n_vocab / 32 of them, then the few tokens in the words that matter): with few tokens allowed the
    candidates are cut down to those, in id order, so the samplers after this one (top-k, softmax,
    the draw) work on them only, not on the whole vocabulary; with few forbidden, those get -inf.
    """

    def __init__(self, compiled: Compiled, start_after: str | None = None, piece: Any = None) -> None:
        self.matcher = compiled.matcher.deep_copy()
        n_words = (compiled.n_vocab + 31) // 32
        self._bits = np.full(n_words, -1, dtype=np.int32)
        self.masks = 0  # masks applied
        self.shortcuts = 0  # of those, greedy draws settled by the best candidate's bit alone
        # set by the chain (engine/sampling.py) when a greedy draw follows: only the best allowed candidate matters
        self.greedy = False
        self.active = not start_after
        self._marker = start_after or ""
        self._seen = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._piece = piece
        self._ready: np.ndarray | None = None  # this step's mask, computed ahead by a MaskPrefetch
        self.error: str | None = None
        iface = llama_cpp.llama_sampler_i()
        self._callbacks = (
            llama_cpp.llama_sampler_i_name(lambda _s: b"localinfer-constraint"),
            llama_cpp.llama_sampler_i_accept(lambda _s, token: self._accept(token)),
            llama_cpp.llama_sampler_i_apply(lambda _s, cur_p: self._apply(cur_p)),
        )
        iface.name, iface.accept, iface.apply = self._callbacks
        self._iface = iface
        # llama_sampler_init allocates with new, so the chain's free deletes it as its own
        self.sampler = llama_cpp.llama_sampler_init(ctypes.pointer(iface), None)

    @property
    def wants_mask(self) -> bool:
        """Its next token needs a mask (it is active and not in error)."""
        return self.active and self.error is None

    @property
    def complete(self) -> bool:
        """The document is whole (the matcher accepts where it stands)."""
        return self.active and self.error is None and bool(self.matcher.is_accepting())

    def _apply(self, cur_p: Any) -> None:
        if not self.active or self.error is not None:
            return  # a matcher in error would mask every token: the answer is reported incomplete instead
        try:
            arr = cur_p.contents
            n = arr.size
            # the candidates as rows of (id, logit, p): 3 x 4 bytes, viewed in place
            raw = (ctypes.c_char * (n * 12)).from_address(ctypes.cast(arr.data, ctypes.c_void_p).value)
            rows = np.frombuffer(raw, dtype=np.float32).reshape(n, 3)
            self._mask(arr, rows, n)
        except Exception as exc:  # an exception must not cross the C callback: record it
            self.error = f"constraint failed: {exc}"

    def _mask(self, arr: Any, rows: np.ndarray, n: int) -> None:
        """The mask (computed now, or ahead by a MaskPrefetch) onto the candidates."""
        bits, self._ready = self._ready, None
        if bits is None:
            bits = self._bits
            self.matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        self.masks += 1
        words = bits.view(np.uint32)
        if self.greedy and self._best_allowed(arr, rows, words):
            return
        ids = rows[:, 0].view(np.int32)
        if not (n <= 32 * len(words) and ids[0] == 0 and ids[-1] == n - 1):  # not the whole vocabulary in id order
            keep = np.unpackbits(bits.view(np.uint8), bitorder="little").view(bool)[ids]
            rows[:, 1] = np.where(keep, rows[:, 1], -np.inf)
            return
        some, full = np.flatnonzero(words), np.flatnonzero(words != 0xFFFFFFFF)
        if len(some) <= len(full):  # few allowed: keep those candidates only
            allowed = _set_bits(words, some)
            allowed = allowed[allowed < n]
            if len(allowed) == 0:
                rows[:, 1] = -np.inf  # nothing can follow (the matcher is in error): reported by accept
                return
            rows[: len(allowed)] = rows[allowed]
            arr.size = len(allowed)
        else:  # few forbidden: -inf for those
            forbidden = _set_bits(~words, full)
            rows[forbidden[forbidden < n], 1] = -np.inf

    def _best_allowed(self, arr: Any, rows: np.ndarray, words: np.ndarray) -> bool:
        """Greedy: where the mask allows the best candidate (the first of the highest logits, as the
        greedy draw takes it), that candidate alone is left - the draw the whole mask would give, without
        spreading the mask over the vocabulary (a millisecond a token on long strings and enums). Its
        bit in the mask, not llguidance's validate_tokens: the mask leaves out some tokens the grammar
        accepts (such as '":'), and a greedy answer must not depend on the path (commit 49d500e)."""
        best = int(np.argmax(rows[:, 1]))
        token = int(rows[best, 0:1].view(np.int32)[0])
        if not (0 <= token < 32 * len(words) and (int(words[token >> 5]) >> (token & 31)) & 1):
            return False
        rows[0] = rows[best]
        arr.size = 1
        self.shortcuts += 1
        return True

    def _accept(self, token: int) -> None:
        try:
            if self.active:
                if not self.matcher.consume_token(token):
                    self.error = self.error or _one_line(self.matcher.get_error() or "token refused")
                return
            self._seen = (self._seen + self._decoder.decode(self._piece(token)))[-4 * len(self._marker) :]
            if self._marker in self._seen:
                self.active = True
        except Exception as exc:
            self.error = f"constraint failed: {exc}"


def _set_bits(words: np.ndarray, index: np.ndarray) -> np.ndarray:
    """The token ids of the set bits of ``words`` (the whole bitmask), which lie in the words at
    ``index``: from those words where they are few, else from the whole mask unpacked at once (a
    mask half set costs a 32-column table per word: milliseconds on a string's content)."""
    if len(index) <= _FEW_WORDS:
        return _tokens(index, words[index])
    return np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))


def _tokens(index: np.ndarray, words: np.ndarray) -> np.ndarray:
    """The token ids of the set bits of ``words``, the bitmask's words at ``index``, in order."""
    return (index[:, None] * 32 + _BIT)[((words[:, None] >> _BIT) & 1).astype(bool)]


class MaskPrefetch:
    """The next masks of a batch's constrained sequences (``wants_mask``), computed on a worker thread
    while ``llama_decode`` runs: a sequence's next mask depends only on the tokens its matcher has
    accepted, all known before the decode starts, and both calls drop the GIL. llguidance's executor
    spreads the batch's masks over its own threads. On a GPU the CPU is idle meanwhile; on a CPU it
    is the work the samplers would do one mask after another, done beside the decode and in parallel.
    ``start`` before the decode, ``wait`` after it (before sampling)."""

    def __init__(self, n_vocab: int, n_seq: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        import llguidance

        self._buf = np.full((n_seq, (n_vocab + 31) // 32), -1, dtype=np.int32)
        self._executor = llguidance.LLExecutor()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="localinfer-masks")
        self._future: Any = None
        self._given: list[ConstraintSampler] = []

    def start(self, limiters: list[ConstraintSampler]) -> None:
        for lim in self._given:  # a mask not taken last step is stale now
            lim._ready = None
        todo = [lim for lim in limiters if lim.wants_mask][: len(self._buf)]
        self._given = todo
        if not todo:
            return
        for i, lim in enumerate(todo):
            lim._ready = self._buf[i]
        buf = self._buf
        work = [(lim.matcher, i) for i, lim in enumerate(todo)]
        self._future = self._pool.submit(self._executor.unsafe_compute_mask_ptr, work, buf.ctypes.data, buf.shape[1] * 4, len(buf))

    def wait(self) -> None:
        future, self._future = self._future, None
        if future is None:
            return
        try:
            future.result()
        except Exception:  # the samplers compute their own masks instead
            for lim in self._given:
                lim._ready = None

    def close(self) -> None:
        self.wait()
        self._pool.shutdown(wait=True)


def mask_prefetch(model: Any, n_seq: int) -> MaskPrefetch | None:
    """A MaskPrefetch for a batch on ``model``, where computing masks beside llama_decode can pay: the
    decode leaves CPU free (layers on a GPU or other devices, or fewer threads than physical cores).
    Where every core decodes, the masks would only take turns with the decode's threads, plus a
    hand-off between threads at each step: None, and each sampler computes its own."""
    from localinfer.engine.backend import default_threads, supports_gpu_offload

    opts = model.options
    offloaded = bool(opts.rpc_servers) or (opts.n_gpu_layers != 0 and supports_gpu_offload())
    if offloaded or max(model.n_threads, model.n_threads_batch) < default_threads():
        return MaskPrefetch(model.n_vocab, n_seq)
    return None
