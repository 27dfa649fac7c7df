"""Speculative decoding in the batched engine (BatchDecoder, serve, batch): which sequences draft
this step and how many tokens, and what verification keeps of each sequence's draft.

A drafting sequence puts its next token and its drafted tokens in the step's batch, one row each,
every row asking for logits (engine/batch_step.py fills them). After the decode its own sampler
chain samples row after row while the sampled token is the drafted one - as the single-sequence
path does (engine/speculate.py): greedy gives the plain decode's tokens, sampling follows the
model's distribution, a constraint advances only on kept tokens and a drafted token it forbids ends
the draft before the batch. Acceptance is each sequence's own (its NgramDrafter); what a step
costs by its rows is the decoder's (one DraftCosts), which lays the step out: a width and a block
of consecutive ids that each get that many rows more, so that llama.cpp decodes it in one pass
(or two: a plain one and the block's), as raises the whole batch's expected tokens per second.
The cells of rejected tokens, of anything after the token that ends an answer, and of the rows
that pad a shorter draft to the width are dropped. Under greedy a row whose top token does not lead
by speculate.GREEDY_MARGIN ends the verification there: the sequence hands out the drafted tokens
kept before it and decodes that row's input token again next step, alone (no draft, no padding:
one row, as a plain step gives it), so that a near-tie is decided as without drafting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from localinfer.engine.draft_costs import Layout
from localinfer.engine.speculate import cut_at_constraint, verify_draft

if TYPE_CHECKING:
    from localinfer.engine.slots import Slot


def plan(active: list[Slot], room: int, n_ctx_seq: int, filler_pos: Callable[[int], int] | None) -> tuple[int, Layout]:
    """Set each generating sequence's ``draft`` and ``pad`` for this step (the others' stay empty),
    ``room`` batch rows at most in all: the rows added (idle ids' included) and the layout. The
    drafting sequences offer their guesses and DraftCosts.choose picks the width and the block of
    ids that raise the batch's expected tokens per second; each id in the block gets that many rows
    more - its drafted tokens, then throwaway rows to the width (``pad``; an idle id's filler too),
    so that llama.cpp decodes the step in one pass. ``filler_pos`` (None: idle ids get no filler)
    is where an idle id's filler goes."""
    first = active[0].seq
    caps = [n_ctx_seq - 1 - filler_pos(first + i) if filler_pos is not None else -1 for i in range(active[-1].seq - first + 1)]
    offers: list[tuple[Slot, int, list[int]]] = []
    n_seqs = 0
    for s in active:
        s.pad = 0
        if s.prompt is not None:
            caps[s.seq - first] = -1
            continue
        n_seqs += 1
        # a throwaway row needs a cell too; M-RoPE cells are not dropped by position (batch_media)
        caps[s.seq - first] = -1 if s.shift else n_ctx_seq - 1 - s.pos
        drafter = s.drafter
        if drafter is None:
            continue
        s.draft = []
        if drafter.alone:  # greedy was unsure of its last batch row: one row this step, no padding
            drafter.alone = False
            caps[s.seq - first] = -1
            continue
        # tokens past the answer's limit or the sequence's context would never be used
        limit = n_ctx_seq - s.pos - 2
        if s.max_tokens is not None:
            limit = min(limit, s.max_tokens - s.n_gen - 1)
        limit = min(limit, room)
        if limit <= 0:
            continue
        n, guess = drafter.offer(limit)
        if guess:
            offers.append((s, n, guess))
    if not offers:
        return 0, NO_LAYOUT
    costs = offers[0][0].drafter.costs  # one per context, shared by its drafters
    at = [s.seq - first for s, _, _ in offers]
    layout = costs.choose(n_seqs, [(s.drafter.rate(n), len(guess)) for s, n, guess in offers], at, caps, room)
    spare = room - layout.width * (layout.hi - layout.lo + 1)
    for (s, n, guess), want in zip(offers, layout.counts):
        extra = max(0, s.drafter.min_draft - want) if want > 0 else 0  # raised to the minimum draft
        if extra > spare:
            want = 0
        spare -= extra if want else 0
        s.draft = cut_at_constraint(s.limiter, s.drafter.take(n, guess, want))
    width, lo, hi = layout.width, first + layout.lo, first + layout.hi
    if width <= 0:
        return sum(len(s.draft) for s in active), NO_LAYOUT
    total = 0
    for s in active:
        if s.prompt is None and lo <= s.seq <= hi:
            s.pad = max(0, min(width, caps[s.seq - first]) - len(s.draft))
        total += len(s.draft) + s.pad
    if filler_pos is not None:  # the idle ids in the block: a filler row and ``width`` more
        total += width * (hi - lo + 1 - sum(1 for s in active if lo <= s.seq <= hi))
    return total, Layout(layout.counts, width, lo, hi)


NO_LAYOUT = Layout([], 0, 0, -1)


def verify(s: Slot, sample: Callable[[object, int], int]) -> tuple[list[tuple[int, int]], int]:
    """Sample ``s``'s rows from its first (``s.idx``) while the sampled token is the drafted one:
    the tokens to hand out, each with its row, and how many drafted tokens were kept. The last
    token is the model's own (at the first disagreement, or after a draft kept whole) - except
    where greedy was unsure of a row (speculate.verify_draft): then the last token handed out (or,
    where none is, ``s.last``, whose cell ``s.pos`` now points at) is evaluated again next step,
    alone."""
    chain, draft, guard = s.chain, s.draft, s.drafter.greedy
    if guard is not None and s.job.sampling.greedy:
        group, kept, sure = verify_draft(lambda i: guard.pick(chain, i), draft, s.idx)
    else:
        group, kept, sure = verify_draft(lambda i: sample(chain, i), draft, s.idx)
    if not sure:
        s.drafter.alone = True
        if not group:  # ``last`` leaves the cache too: its cell is just before the draft's
            s.pos -= len(draft) + 1
    return group, kept
