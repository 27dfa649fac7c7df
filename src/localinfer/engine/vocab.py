"""A loaded model's vocabulary: text to tokens and back (a base of ``engine.model.LlamaModel``, which sets
``_vocab``, ``_outs`` and ``_piece_buf`` when it loads)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from localinfer.engine.backend import llama_cpp
from localinfer.errors import GenerationError


class Vocab:
    """Tokenizing and detokenizing with a loaded model's vocabulary."""

    _vocab: Any
    _outs: dict[int, tuple[bytes, str | None, bool]]
    _piece_buf: Any

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            from localinfer.request.limits import require_utf8

            require_utf8(text, "the text")
            raise
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

    def token_out(self, token: int) -> tuple[bytes, str | None, bool]:
        """What a sampled token adds to the answer, cached: its bytes (control tokens render as
        nothing), their text when they are whole UTF-8 characters on their own (else None: part of
        a character split across tokens), and whether it ends generation."""
        out = self._outs.get(token)
        if out is None:
            raw = self._piece(token)
            try:
                text: str | None = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            out = self._outs[token] = (raw, text, bool(llama_cpp.llama_vocab_is_eog(self._vocab, token)))
        return out

    def piece(self, token: int) -> bytes:
        """The bytes a sampled token adds to the answer (control tokens render as nothing)."""
        return self.token_out(token)[0]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")
