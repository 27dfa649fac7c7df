"""Constrained decoding: a :class:`~localinfer.structured.Format` compiled for a loaded model, and
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
on the whole vocabulary), sets forbidden logits to -inf, and advances its matcher when the chain
accepts a token. End of generation is allowed only where the document is complete, and once it is
complete nothing else is; so the answer ends right after the document.

Bounds: structured.py bounds the schema's size and depth; llguidance's parser limits (below) bound
the lexer's states and the work of one mask, so a pathological schema fails instead of hanging.
"""

from __future__ import annotations

import codecs
import ctypes
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from localinfer.engine.backend import llama_cpp
from localinfer.structured import Format, FormatError, gbnf_to_lark

CACHE_SIZE = 64  # compiled formats kept per loaded model
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

    def __init__(self, model: Any) -> None:
        self.tokenizer = _tokenizer(model)
        self.n_vocab = model.n_vocab
        self._cache: OrderedDict[tuple[str, str], Compiled] = OrderedDict()
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
            self._cache[key] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def _matcher(self, fmt: Format) -> Any:
        from llguidance import LLMatcher

        grammar = grammar_of(fmt)
        matcher = LLMatcher(self.tokenizer, grammar, log_level=0, limits=_limits())
        if matcher.is_error():
            raise FormatError(f"cannot compile the {_what(fmt)}: {_one_line(matcher.get_error())}")
        return matcher


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
        piece = buf.raw[: max(n, 0)]
        attr = llama_cpp.llama_vocab_get_attr(vocab, t)
        # llguidance's mark of a special token (it never matches grammar text)
        if attr & control or (attr & user and piece.startswith(b"<") and piece.endswith(b">")):
            piece = b"\xff" + piece
        tokens.append(piece)
    eog = sorted({t for t in (llama_cpp.llama_vocab_eos(vocab), llama_cpp.llama_vocab_eot(vocab)) if t >= 0})
    tokenize = ctypes.cast(llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
    return LLTokenizer.from_llamacpp(tokens=tokens, vocab_ptr=vocab, tokenize_fptr=tokenize, eos_token=eog or None)


def grammar_of(fmt: Format) -> str:
    """llguidance's grammar text for a format (JSON schema, or Lark from the GBNF)."""
    from llguidance import LLMatcher

    if fmt.kind == "grammar":
        return LLMatcher.grammar_from_lark(gbnf_to_lark(fmt.text))
    schema = ANY_OBJECT if fmt.kind == "json" else fmt.text
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
            compiler = _compilers[model] = Compiler(model)
    return compiler.compile(fmt)


# -- the sampler ------------------------------------------------------------------------------------
_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


class ConstraintSampler:
    """One sequence's constraint as a native ``llama_sampler`` (its callbacks kept alive here).

    ``start_after``: the constraint is inactive until the sampled text has passed this marker (the end
    of a reasoning block); ``piece(token) -> bytes`` gives that text."""

    def __init__(self, compiled: Compiled, start_after: str | None = None, piece: Any = None) -> None:
        self.matcher = compiled.matcher.deep_copy()
        n_words = (compiled.n_vocab + 31) // 32
        self._bits = np.full(n_words, -1, dtype=np.int32)
        self.active = not start_after
        self._marker = start_after or ""
        self._seen = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._piece = piece
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
    def complete(self) -> bool:
        """The document is whole (the matcher accepts where it stands)."""
        return self.active and self.error is None and bool(self.matcher.is_accepting())

    def _apply(self, cur_p: Any) -> None:
        if not self.active:
            return
        try:
            arr = cur_p.contents
            bits = self._bits
            self.matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
            data = np.ctypeslib.as_array(ctypes.cast(arr.data, ctypes.POINTER(ctypes.c_uint8)),
                                         (arr.size * _TOKEN_DATA.itemsize,)).view(_TOKEN_DATA)  # fmt: skip
            allowed = np.unpackbits(bits.view(np.uint8), bitorder="little").view(bool)
            ids = data["id"]
            # first in the chain, the candidates are the whole vocabulary in id order
            in_order = arr.size <= len(allowed) and ids[0] == 0 and ids[-1] == arr.size - 1
            keep = allowed[: arr.size] if in_order else allowed[ids]
            np.copyto(data["logit"], -np.inf, where=~keep)
        except Exception as exc:  # an exception must not cross the C callback: record it
            self.error = f"constraint failed: {exc}"

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
