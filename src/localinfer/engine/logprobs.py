"""Log probabilities of the sampled tokens, read from the logits of the sampled row only.

``llama_sampler_sample`` copies the row before its samplers transform it, so after sampling the
context still holds the model's raw distribution: we report the log-softmax of those logits (as
llama-server does by default, ``post_sampling_probs: false``), never penalties or temperature.
Nothing like ``logits_all``: one row of ``n_vocab`` floats per token, viewed in place by numpy.

An entry is OpenAI's content shape: ``{"token", "logprob", "bytes", "top_logprobs": [...]}``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

MAX_TOP = 20  # OpenAI's bound for top_logprobs (request/rules.py holds it for requests)
Entry = dict[str, Any]


def token_text(raw: bytes) -> str:
    """A token's text as llama-server shows it: the bytes up to an unfinished UTF-8 character
    (a token may hold part of one); ``bytes`` keeps them all."""
    return raw.decode("utf-8", errors="ignore")


class Logprobs:
    """One sequence's log probabilities: ``add`` after each counted token (on the decoding thread,
    before the next ``llama_decode`` overwrites the row), ``entries`` at the end. Made by
    ``LlamaModel.new_logprobs`` (``ctx``: its context; ``piece``: a token's bytes in the answer)."""

    __slots__ = ("_logits", "_ctx", "_n_vocab", "_top", "_buf", "_np", "_piece", "tokens", "chosen",
                 "top_ids", "top_lps", "_starts", "_size", "_sent", "_blocks")  # fmt: skip

    def __init__(self, ctx: Any, n_vocab: int, piece: Callable[[int], bytes], top_n: int) -> None:
        import numpy as np

        from localinfer.engine.backend import llama_cpp

        self._np = np
        self._logits = llama_cpp.llama_get_logits_ith
        self._ctx = ctx
        self._n_vocab = n_vocab
        self._top = max(0, min(int(top_n), MAX_TOP, self._n_vocab))
        self._buf = np.empty(self._n_vocab, dtype=np.float32)  # exp() works here: no array per token
        self._blocks = max(self._top, min(256, self._n_vocab // 4))  # see _top_ids
        self._piece = piece
        self.tokens: list[int] = []
        self.chosen: list[float] = []
        self.top_ids: list[Any] = []
        self.top_lps: list[Any] = []
        self._starts: list[int] = []  # each token's first byte in the answer (its pieces joined)
        self._size = 0
        self._sent = 0  # entries handed out by ``take``

    def add(self, index: int, token: int) -> None:
        """Read row ``index`` of the last batch (-1: the last row) for the token sampled from it."""
        np = self._np
        ptr = self._logits(self._ctx, index)
        row = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self._n_vocab,))
        buf = self._buf
        top = self._top
        if top:
            ids = self._top_ids(row, top)
            vals = row[ids]
            peak = vals[0]
        else:
            peak = row.max()
        np.subtract(row, peak, out=buf)
        np.exp(buf, out=buf)
        lse = float(peak) + float(np.log(buf.sum()))  # numpy sums pairwise: float32 is exact enough
        self.tokens.append(token)
        self.chosen.append(float(row[token]) - lse)
        if top:
            self.top_ids.append(ids)
            self.top_lps.append(vals.astype(np.float64) - lse)  # as the chosen one: the same value twice
        self._starts.append(self._size)
        self._size += len(self._piece(token))

    def _top_ids(self, row: Any, k: int) -> Any:
        """The ``k`` largest logits' ids, largest first. A full argpartition of the vocabulary costs
        ~10x more: split the logits into 256 strided groups (column maxima: one vectorised pass);
        the k-th largest group maximum is a bound at or below the k-th largest logit (those maxima
        are k distinct logits), and only the few logits at or above it are sorted."""
        np = self._np
        n = self._n_vocab - self._n_vocab % self._blocks
        bound = np.partition(row[:n].reshape(-1, self._blocks).max(axis=0), -k)[-k]
        cand = np.flatnonzero(row >= bound)
        return cand[np.argsort(-row[cand], kind="stable")[:k]]

    def __len__(self) -> int:
        return len(self.tokens)

    def entries(self, start: int = 0, stop: int | None = None) -> list[Entry]:
        """Entries ``start:stop`` in OpenAI's content shape."""
        piece, top = self._piece, self._top
        out: list[Entry] = []
        for i in range(start, len(self.tokens) if stop is None else stop):
            raw = piece(self.tokens[i])
            alts = []
            if top:
                for tid, lp in zip(self.top_ids[i].tolist(), self.top_lps[i].tolist()):
                    b = piece(tid)
                    alts.append({"token": token_text(b), "logprob": lp, "bytes": list(b)})
            out.append({"token": token_text(raw), "logprob": self.chosen[i], "bytes": list(raw), "top_logprobs": alts})
        return out

    def take(self, emitted_bytes: int) -> list[Entry]:
        """For a stream: the entries not yet handed out whose token starts within the first
        ``emitted_bytes`` bytes of the answer (what its text so far holds)."""
        end = self._sent
        starts = self._starts
        while end < len(starts) and starts[end] < emitted_bytes:
            end += 1
        out = self.entries(self._sent, end)
        self._sent = end
        return out


def trim(entries: Sequence[Entry] | None, text: str) -> list[Entry] | None:
    """The entries of the tokens whose bytes begin inside ``text`` (the answer as returned): a
    stop string's tokens, cut from the text, go too (llama-server drops them as well)."""
    if entries is None:
        return None
    size = len(text.encode("utf-8", errors="surrogatepass"))
    out, at = [], 0
    for e in entries:
        if at >= size:
            break
        out.append(e)
        at += len(e["bytes"])
    return out
