"""What a decode step costs in one context, and how a step lays its drafts out (speculative
decoding, engine/draft.py's drafters): ``DraftCosts`` learns a step's time by its rows and the
context's recent acceptance, and chooses the step's ``Layout`` - how many guessed tokens each
sequence verifies, and which ids get throwaway rows so that llama.cpp decodes the step in one pass.

Pure Python (no llama_cpp): the engine times its steps into it (engine/speculate.py,
engine/batch_step.py).
"""

from __future__ import annotations

import bisect
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

# the lookup's match lengths (engine/draft.py), by which acceptance is counted here too
N_MAX = 5  # longest n-gram looked up
N_MIN = 2  # shortest: a single token matches too often to be worth a batch
DECAY = 0.9  # acceptance counts fade by this at each draft (what the answer does now matters more)
GAIN_MARGIN = 1.05  # a draft must promise this much over a plain step (the lookup's cost, the noise)
# a machine's load changes: after this many plain steps a short draft (EXPLORE_DRAFT) measures again
EXPLORE_EVERY, EXPLORE_DRAFT = 64, 2
TRUST_AFTER = 3  # drafted steps timed before the cost model may say that no draft pays
CARRY_WEIGHT = 4.0  # tries of the context's recent acceptance a new sequence starts with
BLOCK_OFFERS = 8  # a batch with more offers than this weighs one two-pass block, not every one


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
        faded_add(self.kept, self.tried, n, kept, tried)

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
        room = sys.maxsize if room is None else room
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


def faded_add(kept: dict[int, float], tried: dict[int, float], n: int, k: float, t: float) -> None:
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
