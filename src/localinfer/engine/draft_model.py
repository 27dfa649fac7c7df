"""Draft tokens for speculative decoding from a second, smaller model (--draft-model): its own
context, kept in step with the tokens the target accepted, and its greedy guess of what follows.

The target's side is engine/speculate.py's, unchanged: it verifies a draft in one batch and keeps
what its own sampler chain draws, so greedy output is the plain decode's and sampling follows the
target's distribution whatever the draft model guesses. ``ModelDrafter`` is one more source of
guesses behind the n-gram drafter's interface (engine/draft.py): its acceptance bookkeeping,
back-off and cost model are reused, with the draft model's own time counted into the cost of
each drafted token, so drafting stops where the second model does not pay.

Compatibility follows llama.cpp's common/speculative.cpp (``common_speculative_are_compatible``):
the same tokenizer type, BOS (where it is added) and EOS, vocabulary sizes at most
VOCAB_SIZE_SLACK apart (the padding of a model family's sizes) and the same text for every token
both have from CHECK_FROM on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from localinfer.engine.backend import llama_cpp
from localinfer.engine.draft import DEFAULT_MAX_DRAFT, N_MIN, DraftCosts, NgramDrafter

VOCAB_SIZE_SLACK = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
CHECK_FROM = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID: the first ids are control tokens
# A draft model guesses at every step, so a plain step (what a draft must beat) is timed on purpose:
# the first of an answer, then one after every PLAIN_EVERY drafts (a loaded machine's speed changes)
PLAIN_EVERY = 16
_TYPES = {0: "none", 1: "SentencePiece", 2: "BPE", 3: "WordPiece", 4: "UGM", 5: "RWKV", 6: "PLaMo-2"}


def vocab_mismatch(target: Any, draft: Any) -> str | None:
    """How ``draft``'s vocabulary differs from ``target``'s (two engine Models), in a few words, or
    None where a drafted token id means the same text to both."""
    tv, dv = target._vocab, draft._vocab
    t_type, d_type = int(llama_cpp.llama_vocab_type(tv)), int(llama_cpp.llama_vocab_type(dv))
    if t_type != d_type:
        return f"its tokenizer is {_TYPES.get(d_type, d_type)}, the target's {_TYPES.get(t_type, t_type)}"
    if abs(target.n_vocab - draft.n_vocab) > VOCAB_SIZE_SLACK:
        return f"its vocabulary has {draft.n_vocab} tokens, the target's {target.n_vocab}"
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(tv))
    if add_bos != bool(llama_cpp.llama_vocab_get_add_bos(dv)) or (add_bos and target.bos_token != draft.bos_token):
        return f"its BOS token is {_special(draft, 'bos')}, the target's {_special(target, 'bos')}"
    if int(llama_cpp.llama_vocab_eos(tv)) != int(llama_cpp.llama_vocab_eos(dv)):
        return f"its EOS token is {_special(draft, 'eos')}, the target's {_special(target, 'eos')}"
    get = llama_cpp.llama_vocab_get_text
    for i in range(CHECK_FROM, min(target.n_vocab, draft.n_vocab)):
        a, b = get(tv, i), get(dv, i)
        if a != b:
            return f"token {i} is {_show(b)} in it, {_show(a)} in the target"
    return None


def _special(model: Any, which: str) -> str:
    tok = int(getattr(llama_cpp, f"llama_vocab_{which}")(model._vocab))
    if not model.add_bos and which == "bos":
        return "not added"
    return f"{tok} {model.token_text(tok)!r}" if tok >= 0 else "none"


def _show(text: bytes | None) -> str:
    return repr((text or b"").decode("utf-8", errors="replace"))


class DraftModel:
    """The second model, loaded with its own context (``model``: an engine Model), and its greedy
    guesses. Its cache holds the sequence so far and the guesses last made; ``guess`` first drops
    what the target did not keep."""

    def __init__(self, model: Any, target_n_vocab: int) -> None:
        self.model = model
        self.name = model.path.name
        self._greedy = llama_cpp.llama_sampler_init_greedy()
        # a guess the target cannot even represent ends the draft (sizes may differ by a little)
        self._n_vocab = min(target_n_vocab, model.n_vocab)
        self._eog = llama_cpp.llama_vocab_is_eog

    def close(self) -> None:
        if self._greedy is not None:
            llama_cpp.llama_sampler_free(self._greedy)
            self._greedy = None
        self.model.close()

    def sync(self, tokens: Sequence[int], logits: bool = False) -> None:
        """Make the cache hold ``tokens`` (the longest prefix it shares is kept; with ``logits``
        at least the last token is evaluated, so its logits are there to guess from)."""
        m = self.model
        cached = m._tokens
        n, limit = 0, min(len(cached), len(tokens) - logits)
        while n < limit and cached[n] == tokens[n]:
            n += 1
        n = m.keep_prefix(n)  # 0 where the cache cannot drop a suffix (it starts over)
        m._decode(tokens[n:])

    def guess(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens the draft model expects after ``tokens``, greedily; fewer where it
        would end the answer or the context is full."""
        m = self.model
        if k <= 0 or len(tokens) + k >= m.n_ctx:
            return []
        self.sync(tokens, logits=True)
        out: list[int] = []
        sample, ctx, vocab = llama_cpp.llama_sampler_sample, m._ctx, m._vocab
        while True:
            token = int(sample(self._greedy, ctx, -1))
            if token >= self._n_vocab or self._eog(vocab, token):
                break
            out.append(token)
            if len(out) >= k:
                break
            m._decode((token,))
        return out


class ModelDrafter(NgramDrafter):
    """One sequence's drafter with a draft model as its source: NgramDrafter's interface, back-off
    and cost model (all guesses share one acceptance estimate, the match length N_MIN's)."""

    __slots__ = ("source", "_spent", "_since_plain")
    kind = "model"

    def __init__(self, source: DraftModel, history: Iterable[int] = (), max_draft: int = DEFAULT_MAX_DRAFT,
                 costs: DraftCosts | None = None) -> None:  # fmt: skip
        self.source = source
        self._spent = 0.0  # the draft model's time for the last proposal
        self._since_plain = PLAIN_EVERY  # drafts since the last plain step: the first step is plain
        super().__init__(history, max_draft, costs)
        if 0 < len(self.tokens) < source.model.n_ctx:  # the draft reads the prompt now, before the first token
            source.sync(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        # no n-gram index: the draft model keeps the sequence itself
        seq = self.tokens
        for tok in tokens:
            seq.append(tok)
            if self._pause:
                self._pause -= 1

    def propose(self, limit: int | None = None) -> list[int]:
        """As NgramDrafter.propose, deciding the length before guessing: each guessed token costs a
        step of the draft model."""
        self._spent = 0.0
        if self._pause:
            return []
        if self._since_plain >= PLAIN_EVERY or not self.costs.rows:
            self._since_plain = 0
            return []
        k = self.size if limit is None else min(self.size, limit)
        k = self.worth(N_MIN, k) if k > 0 else 0
        if k <= 0 or len(self.tokens) + k >= self.source.model.n_ctx:  # past the draft's context: no guess
            return []
        # catching up after a pause is not what a draft costs; reading the newest token is
        self.source.sync(self.tokens[:-1])
        t0 = self.costs.clock()  # the clock the target's steps are timed by (CPU time on the CPU)
        draft = self.source.guess(self.tokens, k)
        self._spent = self.costs.clock() - t0
        self._last_n = N_MIN
        self._since_plain += bool(draft)
        return draft

    def observe(self, n_tokens: int, seconds: float) -> None:
        """The target's step took ``seconds``; the draft model's guessing is part of its cost."""
        self.costs.observe(n_tokens, seconds + self._spent)
        self._spent = 0.0
