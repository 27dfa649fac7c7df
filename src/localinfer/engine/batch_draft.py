"""Speculative decoding in the batched engine (BatchDecoder, serve, batch): which sequences draft
this step and how many tokens, and what verification keeps of each sequence's draft.

A drafting sequence puts its next token and its drafted tokens in the step's batch, one row each,
every row asking for logits (engine/batch_step.py fills them). After the decode its own sampler
chain samples row after row while the sampled token is the drafted one - as the single-sequence
path does (engine/speculate.py): greedy gives the plain decode's tokens, sampling follows the
model's distribution, a constraint advances only on kept tokens and a drafted token it forbids ends
the draft before the batch. Acceptance is each sequence's own (its NgramDrafter); what a step
costs by its rows is the decoder's (one DraftCosts), and the step's drafted rows go to the
guesses likeliest kept, as many as raise the whole batch's expected tokens per second.
The cells of rejected tokens, and of anything after the token that ends an answer, are dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from localinfer.engine.speculate import cut_at_constraint

if TYPE_CHECKING:
    from localinfer.engine.slots import Slot


def plan(active: list[Slot], room: int, n_ctx_seq: int) -> int:
    """Set each generating, drafting sequence's ``draft`` for this step (the others' stays empty),
    ``room`` batch rows at most in all; the number of drafted tokens. The sequences offer their
    guesses and the step's rows go to the likeliest kept, as many as raise the batch's expected
    tokens per second (DraftCosts.choose, for the step's sequences together)."""
    offers: list[tuple[Slot, int, list[int]]] = []
    n_seqs = 0
    for s in active:
        if s.prompt is not None:
            continue
        n_seqs += 1
        drafter = s.drafter
        if drafter is None:
            continue
        s.draft = []
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
        return 0
    costs = offers[0][0].drafter.costs  # one per context, shared by its drafters
    wants = costs.choose(n_seqs, [(s.drafter.rate(n), len(guess)) for s, n, guess in offers])
    total = 0
    for (s, n, guess), want in zip(offers, wants):
        cap = room - total
        want = min(want, cap) if s.drafter.min_draft <= cap else 0
        draft = cut_at_constraint(s.limiter, s.drafter.take(n, guess, want))
        s.draft = draft
        total += len(draft)
    return total


def verify(s: Slot, sample: Callable[[object, int], int]) -> tuple[list[tuple[int, int]], int]:
    """Sample ``s``'s rows from its first (``s.idx``) while the sampled token is the drafted one:
    the tokens to hand out, each with its row, and how many drafted tokens were kept. The last
    token is the model's own (at the first disagreement, or after a draft kept whole)."""
    chain, first, draft = s.chain, s.idx, s.draft
    group: list[tuple[int, int]] = []
    for j, guess in enumerate(draft):
        token = sample(chain, first + j)
        group.append((token, first + j))
        if token != guess:
            return group, j
    group.append((sample(chain, first + len(draft)), first + len(draft)))
    return group, len(draft)
