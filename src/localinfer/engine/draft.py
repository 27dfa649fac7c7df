"""Draft tokens for speculative decoding by n-gram lookup: the next tokens guessed by finding the
answer's last few tokens earlier in the prompt or the answer, and proposing what followed them there.

Pure Python on token lists (no llama_cpp): the engine verifies a draft in one batch
(engine/speculate.py); this module owns the guess, the acceptance bookkeeping and the back-off.

The lookup follows prompt-lookup decoding (apoorvumang/prompt-lookup-decoding, llama.cpp's
``ngram-simple``/``ngram-map``): the longest suffix of the sequence, N_MAX tokens down to N_MIN, that
occurred before; of its occurrences, the latest (where an answer copies, the copy goes on from there).
An index from each n-gram to the position after its latest occurrence makes a lookup a few dict hits.

Per sequence, a draft is as long as pays on this machine now (the context's DraftCosts,
engine/draft_costs.py: a cost model learnt from the decode times and the acceptance so far). Back-off on top: a draft fully accepted doubles
the next one's cap (up to ``max_draft``); a partly accepted one sets it to what was accepted plus
one; after MISSES_TO_PAUSE drafts in a row of which nothing was kept, drafting pauses for a number
of tokens that doubles with each pause (up to MAX_PAUSE), so an answer with nothing to copy is
decoded almost entirely one token at a time. A step that drafts nothing still looks its guess up
and scores it against the token the model chose (a free try): where the answer starts copying again
after a stretch that did not, the acceptance estimate sees it at once, not after draft_costs.EXPLORE_EVERY steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from localinfer.engine.draft_costs import N_MAX, N_MIN, DraftCosts, faded_add

KINDS = ("ngram",)  # --draft values; a draft model (--draft-model) is engine/draft_model.py
DEFAULT_MAX_DRAFT = 8  # tokens per guess at most; not tuned yet: the loaded 2-core machine cannot tell
MAX_DRAFT_LIMIT = 64
MISSES_TO_PAUSE = 2
FIRST_PAUSE = 8  # tokens without drafting after the first run of misses
MAX_PAUSE = 32  # a safety net (the rates already stop guesses that miss): a longer pause can sit
# through the start of a quote that follows a preamble (was 128: half of a 160-token RAG answer)
# acceptance per match length: a prior of PRIOR_RATE over PRIOR_WEIGHT tries, then counts that
# fade at each draft (draft_costs.DECAY: what the answer does now matters more than what it did)
PRIOR_RATE, PRIOR_WEIGHT = 0.6, 2.0


class NgramDrafter:
    """One sequence's drafter: ``extend`` with every token the sequence gets (the prompt first),
    ``propose`` before a step (a batch: ``offer``, then ``take`` what DraftCosts.choose gives it),
    ``observe`` each decode's time, ``feedback`` with what the verification accepted.

    Whether a draft pays depends on the machine: a batch of k+1 tokens costs little more than one
    where decode is memory-bound (a quiet CPU, a GPU), nearly k+1 times one where it is compute-bound
    (a loaded CPU). So the drafter learns both sides - the time of a step by its rows (``observe``)
    and the chance a that a drafted token is kept after a match of n tokens (``feedback``) - and
    drafts the k tokens that maximise expected tokens per second, (1 + a + a^2 + ... + a^k) /
    step(1 + k), or nothing where no k beats a plain step.
    """

    __slots__ = ("tokens", "max_draft", "size", "_index", "_misses", "_pause", "_next_pause", "drafted",
                 "accepted", "drafts", "costs", "_kept", "_tried", "_last_n", "min_draft", "_shadow", "_stopped", "greedy",
                 "alone", "_hold", "_next_hold")  # fmt: skip
    kind = "ngram"

    def __init__(self, history: Iterable[int] = (), max_draft: int = DEFAULT_MAX_DRAFT, costs: DraftCosts | None = None,
                 min_draft: int = 0) -> None:  # fmt: skip
        self.tokens: list[int] = []
        self.max_draft = max(1, int(max_draft))
        # a draft is this long at least, or none (llama-server's speculative.n_min): where the cost
        # model wants fewer tokens they are raised to it, where the lookup has fewer there is none
        self.min_draft = min(self.max_draft, max(0, int(min_draft)))
        self.size = self.max_draft  # the next draft's length at most (back-off shrinks it)
        self._index: dict[tuple[int, ...], int] = {}
        self._misses = 0  # drafts in a row of which nothing was accepted
        self._pause = 0  # tokens still to go without drafting
        self._next_pause = FIRST_PAUSE
        self.drafted = 0  # tokens verified, over the sequence
        self.accepted = 0  # of those, accepted by the model
        self.drafts = 0  # drafts verified
        self.costs = costs if costs is not None else DraftCosts()  # shared by the sequences of one context
        # by match length: tokens kept, and kept + rejected; starting from what the context's last
        # drafts did (a new answer that drafts as the last one did need not relearn it from the prior)
        self._kept, self._tried = self.costs.carried()
        self._last_n = N_MIN
        self._shadow: tuple[int, int] | None = None  # (match length, guess) of a step that drafted nothing
        self._stopped = False
        # in a batch (engine/batch_draft.py): the context's speculate.GreedyPick, and whether the
        # next step decodes this sequence's last token alone (greedy was unsure of a batch row)
        self.greedy: Any = None
        self.alone = False
        self._hold = 0  # tokens still to go without drafting after greedy replayed (``hold``)
        self._next_hold = FIRST_PAUSE
        self.extend(history)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens; each n-gram whose next token is now known points to it."""
        seq, index = self.tokens, self._index
        for tok in tokens:
            if self._shadow is not None:  # the guess a plain step did not draft, against the model's token
                n, guess = self._shadow
                self._shadow = None
                self._count(n, float(tok == guess), 1.0)
                if tok == guess and not self._stopped:
                    self._pause = 0  # the answer copies again
            seq.append(tok)
            end = len(seq) - 1  # the new token's position: what follows the n-grams ending before it
            for n in range(N_MIN, min(N_MAX, end) + 1):
                index[tuple(seq[end - n : end])] = end
            if self._pause:
                self._pause -= 1
            if self._hold:
                self._hold -= 1

    def lookup(self, limit: int) -> tuple[int, list[int]]:
        """The length of the longest earlier occurrence of the sequence's end, and up to ``limit``
        tokens that followed it there ((0, []): none)."""
        seq, index = self.tokens, self._index
        n_seq = len(seq)
        for n in range(min(N_MAX, n_seq), N_MIN - 1, -1):
            at = index.get(tuple(seq[n_seq - n :]))
            if at is not None:
                return n, seq[at : at + limit]
        return 0, []

    def rate(self, n: int) -> float:
        """The estimated chance that a drafted token is kept, after a match of ``n`` tokens: its own
        counts over a prior of the sequence's rate at every match length (itself over PRIOR_RATE),
        so that the first kept drafts raise every length's estimate, not only their own."""
        pooled = (sum(self._kept.values()) + PRIOR_RATE * PRIOR_WEIGHT) / (sum(self._tried.values()) + PRIOR_WEIGHT)
        return (self._kept[n] + pooled * PRIOR_WEIGHT) / (self._tried[n] + PRIOR_WEIGHT)

    def worth(self, n: int, available: int) -> int:
        """How many of ``available`` drafted tokens to verify after a match of ``n`` when this
        sequence decodes alone: the k that maximises expected tokens per second (0: none pays;
        DraftCosts.choose). A batch asks for all its sequences at once (engine/batch_draft.py)."""
        return self.costs.choose(1, [(self.rate(n), available)]).counts[0]

    def propose(self, limit: int | None = None) -> list[int]:
        """The next draft (empty: decode one token as usual): none while paused, else at most
        ``size`` tokens (``min_draft`` at least), at most ``limit`` (what the context or the answer's
        limit leaves), and only as many as pay (``worth``)."""
        n, draft = self.offer(limit)
        return self.take(n, draft, self.worth(n, len(draft)) if draft else 0)

    def offer(self, limit: int | None = None) -> tuple[int, list[int]]:
        """The guess this sequence could draft now - (match length, tokens), (0, []) for none - before
        the cost model says how much of it pays: none while paused (its first token still a free try)."""
        k = max(self.size, self.min_draft)
        k = k if limit is None else min(k, limit)
        if k <= 0 or self._hold:
            return 0, []
        n, draft = self.lookup(k)
        if not draft or len(draft) < self.min_draft:
            return 0, []
        if self._pause:
            self._shadow = (n, draft[0])
            return 0, []
        return n, draft

    def take(self, n: int, draft: list[int], want: int) -> list[int]:
        """The first ``want`` tokens of an offered draft (``min_draft`` at least); where none, its
        first token is scored by the next extend instead: a try that costs no batch row."""
        if not draft:
            return []
        if want <= 0:
            self._shadow = (n, draft[0])
            return []
        self._last_n = n
        return draft[: max(want, self.min_draft)]

    def observe(self, n_tokens: int, seconds: float) -> None:
        """A decode of ``n_tokens`` (1: a plain step; more: the token and its draft) took ``seconds``."""
        self.costs.observe(n_tokens, seconds)

    def feedback(self, drafted: int, accepted: int) -> None:
        """The model kept ``accepted`` of the ``drafted`` tokens of the last proposal (as verified:
        the engine may cut a proposal short, at a token a constraint forbids)."""
        self.drafts += 1
        self.drafted += drafted
        self.accepted += accepted
        self._count(self._last_n, accepted, accepted + (accepted < drafted))
        if accepted >= drafted:
            self.size = min(self.max_draft, 2 * self.size)
        else:
            self.size = max(1, accepted + 1)
        if accepted:
            self._misses = 0
            self._next_pause = FIRST_PAUSE
            return
        self._misses += 1
        if self._misses >= MISSES_TO_PAUSE:
            self._misses = 0
            self._pause = self._next_pause
            self._next_pause = min(MAX_PAUSE, 2 * self._next_pause)

    def _count(self, n: int, kept: float, tried: float) -> None:
        """A draft (or a free try) after a match of ``n`` kept ``kept`` of ``tried`` tokens."""
        faded_add(self._kept, self._tried, n, kept, tried)
        self.costs.learn(n, kept, tried)

    def hold(self) -> None:
        """No drafts for a while, free tries or not: greedy decoded the cells drafts had filled again
        (engine/single.py ``_greedy_step``: a near-tie after batches), which costs a plain step per
        cell; more drafts now would fill cells to decode again at the next near-tie. 8 tokens,
        doubling up to MAX_PAUSE at each replay of the answer."""
        self._hold = self._next_hold
        self._next_hold = min(MAX_PAUSE, 2 * self._next_hold)

    def stop(self) -> None:
        """No more drafts for this sequence (its cache cannot take back rejected tokens)."""
        self._pause = 1 << 62
        self._stopped = True

    @property
    def paused(self) -> bool:
        return self._pause > 0


def check(kind: str | None, max_draft: int | None, draft_model: str | None) -> None:
    """Refuse a draft setting we cannot honour (UsageError naming it)."""
    from localinfer.errors import UsageError

    if draft_model is not None and kind is not None:  # one source of guesses per load
        raise UsageError("--draft and --draft-model are two ways to guess: give one of them")
    if draft_model is not None and not str(draft_model).strip():
        raise UsageError("--draft-model needs the name of an installed model")
    if kind is not None and kind not in KINDS:
        raise UsageError(f"--draft takes {', '.join(KINDS)}, not {kind!r}")
    if max_draft is not None and not 1 <= max_draft <= MAX_DRAFT_LIMIT:
        raise UsageError(f"--draft-max must be between 1 and {MAX_DRAFT_LIMIT}, not {max_draft}")


def acceptance(drafted: int, accepted: int) -> str:
    """The stats line's figure: ``draft 74% accepted`` (``draft none`` where nothing was drafted)."""
    if drafted <= 0:
        return "draft none"
    return f"draft {round(100 * accepted / drafted)}% accepted"

