"""Draft tokens for speculative decoding by n-gram lookup: the next tokens guessed by finding the
answer's last few tokens earlier in the prompt or the answer, and proposing what followed them there.

Pure Python on token lists (no llama_cpp): the engine verifies a draft in one batch
(engine/speculate.py); this module owns the guess, the acceptance bookkeeping and the back-off.

The lookup follows prompt-lookup decoding (apoorvumang/prompt-lookup-decoding, llama.cpp's
``ngram-simple``/``ngram-map``): the longest suffix of the sequence, N_MAX tokens down to N_MIN, that
occurred before; of its occurrences, the latest (where an answer copies, the copy goes on from there).
An index from each n-gram to the position after its latest occurrence makes a lookup a few dict hits.

Per sequence, a draft is as long as pays on this machine now (NgramDrafter: a cost model learnt
from the decode times and the acceptance so far). Back-off on top: a draft fully accepted doubles
the next one's cap (up to ``max_draft``); a partly accepted one sets it to what was accepted plus
one; after MISSES_TO_PAUSE drafts in a row of which nothing was kept, drafting pauses for a number
of tokens that doubles with each pause (up to MAX_PAUSE), so an answer with nothing to copy is
decoded almost entirely one token at a time. A step that drafts nothing still looks its guess up
and scores it against the token the model chose (a free try): where the answer starts copying again
after a stretch that did not, the acceptance estimate sees it at once, not after EXPLORE_EVERY steps.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

KINDS = ("ngram",)  # --draft values; a draft model (--draft-model) is engine/draft_model.py
DEFAULT_MAX_DRAFT = 8  # tokens per guess at most; not tuned yet: the loaded 2-core machine cannot tell
MAX_DRAFT_LIMIT = 64
N_MAX = 5  # longest n-gram looked up
N_MIN = 2  # shortest: a single token matches too often to be worth a batch
MISSES_TO_PAUSE = 2
FIRST_PAUSE = 8  # tokens without drafting after the first run of misses
MAX_PAUSE = 32  # a safety net (the rates already stop guesses that miss): a longer pause can sit
# through the start of a quote that follows a preamble (was 128: half of a 160-token RAG answer)
# acceptance per match length: a prior of PRIOR_RATE over PRIOR_WEIGHT tries, then counts that
# fade by DECAY at each draft (what the answer does now matters more than what it did)
PRIOR_RATE, PRIOR_WEIGHT, DECAY = 0.6, 2.0, 0.9
GAIN_MARGIN = 1.05  # a draft must promise this much over a plain step (the lookup's cost, the noise)
# a machine's load changes: after this many plain steps a short draft (EXPLORE_DRAFT) measures again
EXPLORE_EVERY, EXPLORE_DRAFT = 64, 2
TRUST_AFTER = 3  # drafted steps timed before the cost model may say that no draft pays
CARRY_WEIGHT = 4.0  # tries of the context's recent acceptance a new sequence starts with
BLOCK_OFFERS = 8  # a batch with more offers than this weighs one two-pass block, not every one


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
                 "accepted", "drafts", "costs", "_kept", "_tried", "_last_n", "min_draft", "_shadow", "_stopped")  # fmt: skip

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
        if k <= 0:
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
        _faded_add(self._kept, self._tried, n, kept, tried)
        self.costs.learn(n, kept, tried)

    def stop(self) -> None:
        """No more drafts for this sequence (its cache cannot take back rejected tokens)."""
        self._pause = 1 << 62
        self._stopped = True

    @property
    def paused(self) -> bool:
        return self._pause > 0


class DraftCosts:
    """What a decode step costs in one context, by its rows (``step``): learnt from the steps it
    times (moving averages), whether the rows are the sequences' next tokens or drafted ones. A
    batch's cost is not linear in its rows (a kernel takes rows four at a time: on Gemma Q4_K_M 3
    rows cost 1.35 steps, 5 rows 2.3; on SmolLM2 Q4_1 at 2 threads the second row costs 0.67 of the
    first and each row after the fourth 0.4), so a size once timed is priced by its own time, the
    others from the nearest timed sizes.

    ``choose`` lays a step out to raise its expected tokens per second: for s sequences (one, or a
    batch's) (s + the kept drafted tokens expected) / the step's cost, priced by the rows of each
    pass llama.cpp will make of it - not a sequence's share of a step: a drafted row next to four
    sequences' tokens costs what the fifth row costs, not what a row alone would.

    One per context, shared by its sequences' drafters (and kept by a Model across answers: the
    second answer starts with what the first measured). The first TRUST_AFTER drafted steps keep
    their least time (a delayed step is only dearer).

    Steps are timed with ``clock``: the process's CPU time where the model runs on the CPU (on a
    shared machine a step's wall time is mostly how long other processes held the cores, and that
    drowned the difference between a batch and one token: costs learnt at load 7 said no draft
    pays), the wall clock where layers are offloaded (the CPU then only waits for the device).
    """

    __slots__ = ("rows", "_sizes", "per_row", "plain", "timed", "clock", "kept", "tried")

    def __init__(self, offloaded: bool = False) -> None:
        self.clock: Callable[[], float] = time.perf_counter if offloaded else time.process_time
        self.rows: dict[int, float] = {}  # a decode's rows -> its seconds
        self._sizes: list[int] = []  # rows' keys, sorted (step looks its neighbours up by bisection)
        self.per_row: float | None = None  # what a drafted row adds to a step (where no size says)
        self.plain = 0  # plain steps since a draft was last verified
        self.timed = 0  # drafted steps timed
        # acceptance by match length over the context's recent drafts (all its sequences): a new
        # drafter's starting counts (``carried``)
        self.kept = dict.fromkeys(range(N_MIN, N_MAX + 1), 0.0)
        self.tried = dict.fromkeys(range(N_MIN, N_MAX + 1), 0.0)

    def carried(self) -> tuple[dict[int, float], dict[int, float]]:
        """A new sequence's starting counts: the recent ones, weighing CARRY_WEIGHT tries at most
        per match length (its own drafts soon outweigh them)."""
        kept, tried = {}, {}
        for n, t in self.tried.items():
            scale = min(1.0, CARRY_WEIGHT / t) if t > 0 else 0.0
            kept[n], tried[n] = self.kept[n] * scale, t * scale
        return kept, tried

    def learn(self, n: int, kept: float, tried: float) -> None:
        """A sequence's draft after a match of ``n`` kept ``kept`` of ``tried`` (as its drafter counts)."""
        _faded_add(self.kept, self.tried, n, kept, tried)

    def observe(self, n_tokens: int, seconds: float, n_seqs: int = 1, one_pass: bool = True) -> None:
        """A decode of ``n_tokens`` rows, ``n_seqs`` of them the sequences' next tokens and the rest
        drafted, took ``seconds`` (not ``one_pass``: a drafted step of two passes, not one size: it
        only counts as a draft verified)."""
        drafted = n_tokens - n_seqs
        if not one_pass:
            self.plain = 0
            return
        rows, had = self.rows, self.rows.get(n_tokens)
        if had is None:
            bisect.insort(self._sizes, n_tokens)
        if drafted <= 0:
            self.plain += 1
            rows[n_tokens] = _low(had, seconds)
            return
        self.plain = 0
        self.timed += 1
        early = self.timed <= TRUST_AFTER
        rows[n_tokens] = seconds if had is None else min(had, seconds) if early else _low(had, seconds)
        base = rows.get(n_seqs)
        if base is not None:
            added = max(0.0, seconds - base) / drafted
            keep = self.per_row is None or (early and added < self.per_row)
            self.per_row = added if keep else self.per_row if early else _low(self.per_row, added)

    def step(self, n: int) -> float | None:
        """What a decode of ``n`` rows costs: its own time where that size was timed, else
        interpolated between the nearest timed sizes, or extended from the nearest one (None: no
        step timed yet)."""
        rows = self.rows
        got = rows.get(n)
        if got is not None:
            return got
        sizes = self._sizes
        at = bisect.bisect_left(sizes, n)
        lo = sizes[at - 1] if at else 0
        hi = sizes[at] if at < len(sizes) else 0
        if lo and hi:
            return rows[lo] + (rows[hi] - rows[lo]) * (n - lo) / (hi - lo)
        if lo:
            per_row = self.per_row if self.per_row is not None else rows[lo] / lo
            return rows[lo] + per_row * (n - lo)
        if hi:
            return rows[hi] * n / hi
        return None

    def choose(self, n_seqs: int, offers: list[tuple[float, int]], at: list[int] | None = None,
               caps: list[int] | None = None, room: int | None = None) -> Layout:  # fmt: skip
        """The step's layout: how many tokens of each offered draft to verify in a step of ``n_seqs``
        sequences, an offer being (the chance each of its tokens is kept, its tokens) - the one that
        maximises the step's expected tokens per second (a draft's j-th token is kept with chance
        a^j), or none where none beats a plain step by GAIN_MARGIN.

        A batch's ids are ``caps``' positions (the sequences', and idle ones' between them), ``at``
        the offers' ids, ``caps[i]`` the rows id i can add (-1: none, it is prefilling); without
        them each offer is its own id. Over KV streams llama.cpp decodes a batch in one pass only
        where every id has as many rows as the others (engine/batch_step.py), else in one pass per
        run of ids with rows left, each reading all the weights. So a layout is a width w and a
        block of consecutive ids that each get w more rows: its drafts, throwaway rows (``Layout``
        pads) after a shorter one. A block of every id is one pass, priced step(ids * (1 + w)); a
        smaller one a plain pass and one of its own, step(ids) + step(block * w).

        Until a drafted step was timed, EXPLORE_DRAFT tokens (a short draft measures what a drafted
        row costs without risking a long batch that does not pay); until TRUST_AFTER were, a verdict
        of "none pays" is not trusted either (one step that another process delayed would otherwise
        stop drafting for EXPLORE_EVERY steps), nor after EXPLORE_EVERY plain steps."""
        n = len(offers)
        none = Layout([0] * n, 0, 0, -1)
        if not offers:
            return none
        if at is None or caps is None:
            at, caps = list(range(n)), [k for _, k in offers]
        n_ids = len(caps)
        room = n_ids * MAX_DRAFT_LIMIT if room is None else room
        if not self._sizes or self._sizes[0] > n_ids:
            return none  # a plain step first: what drafted rows would add to
        plain = self.step(n_ids) or 0.0
        if self.timed == 0 or plain <= 0.0:
            return self._explore(offers, at, caps, room)
        order = sorted(range(n), key=at.__getitem__)
        # two-pass blocks: from an offering id to an offering id; past BLOCK_OFFERS offers (a wide
        # batch) only the one spanning them all, which keeps a step's choice cheap
        spans = [(x, y) for x in range(n) for y in range(x, n)] if n <= BLOCK_OFFERS else [(0, n - 1)]
        blocks = []
        for x, y in spans:
            lo, hi = at[order[x]], at[order[y]]
            if hi - lo + 1 < n_ids:  # the whole range is the one-pass layout
                blocks.append((lo, hi, order[x : y + 1], min(caps[lo : hi + 1])))
        whole = min(caps)  # the rows every id can add (one pass)
        best, pick = GAIN_MARGIN * n_seqs / plain, none
        gain, chance = [0.0] * n, [1.0] * n
        for w in range(1, max(k for _, k in offers) + 1):
            for i, (a, k) in enumerate(offers):
                if w <= k:
                    chance[i] *= a
                    gain[i] += chance[i]
            if w <= whole and n_ids * w <= room:
                cost = self.step(n_ids * (1 + w))
                if cost and (n_seqs + sum(gain)) / cost > best:
                    best, pick = (n_seqs + sum(gain)) / cost, (w, 0, n_ids - 1)
            for lo, hi, members, low in blocks:
                if low < w or (hi - lo + 1) * w > room:
                    continue
                got = n_seqs + sum(gain[i] for i in members)
                cost = plain + (self.step((hi - lo + 1) * w) or 0.0)
                if got / cost > best:
                    best, pick = got / cost, (w, lo, hi)
        if pick is none:
            if self.timed < TRUST_AFTER or self.plain >= EXPLORE_EVERY:
                self.plain = 0  # one short draft measures again; the next EXPLORE_EVERY plain steps do not
                return self._explore(offers, at, caps, room)
            return none
        return _layout(offers, at, *pick)

    @staticmethod
    def _explore(offers: list[tuple[float, int]], at: list[int], caps: list[int], room: int) -> Layout:
        """EXPLORE_DRAFT rows for every id where each can take them (one pass: the step gets timed),
        else for the likeliest offer alone."""
        w = EXPLORE_DRAFT
        if min(caps) >= w and len(caps) * w <= room:
            return _layout(offers, at, w, 0, len(caps) - 1)
        i = max(range(len(offers)), key=lambda j: offers[j][0])
        w = min(EXPLORE_DRAFT, offers[i][1], caps[at[i]], room)
        return _layout(offers, at, w, at[i], at[i]) if w > 0 else Layout([0] * len(offers), 0, 0, -1)


class Layout(NamedTuple):
    """A step's drafting (DraftCosts.choose): ``counts[i]`` tokens of offer i verified; the ids
    ``lo``..``hi`` each get ``width`` rows more (drafts, then throwaway rows), the others none."""

    counts: list[int]
    width: int
    lo: int
    hi: int


def _layout(offers: list[tuple[float, int]], at: list[int], width: int, lo: int, hi: int) -> Layout:
    return Layout([min(width, k) if lo <= at[i] <= hi else 0 for i, (_, k) in enumerate(offers)], width, lo, hi)


def _faded_add(kept: dict[int, float], tried: dict[int, float], n: int, k: float, t: float) -> None:
    """Counts by match length: every one fades by DECAY, then match length ``n`` adds ``k`` of ``t``."""
    for m in kept:
        kept[m] *= DECAY
        tried[m] *= DECAY
    kept[n] += k
    tried[n] += t


def _low(average: float | None, sample: float) -> float:
    """A moving average that follows a time down fast and up slowly: on a loaded machine a step is
    only ever delayed (another process took the core), so the low times are the step's own cost,
    and a few preempted steps do not make drafts look cheap or plain steps dear."""
    if average is None:
        return sample
    return average + (0.3 if sample < average else 0.05) * (sample - average)


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

