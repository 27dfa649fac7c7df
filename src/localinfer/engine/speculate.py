"""Speculative decoding's verification, shared by the single-sequence loop (``SingleSequence``'s
``_draft_loop``, engine/single.py) and the batched engine (engine/batch_draft.py).

Each step evaluates the last sampled token together with the drafted tokens in one ``llama_decode``
(logits for every row), then picks row after row with the request's own sampler chain and keeps
drafted tokens while they are what was picked: the first disagreement is the model's own next
token. So every kept token is one the chain drew from the model's distribution given the tokens
before it - sampling follows the target distribution (speculative sampling for a deterministic
drafter: a drafted token is kept with probability p(token)), and since the chain draws once per
answer token, in order, a seed reproduces a run. Penalties and a constraint advance in the chain's
``accept`` for each kept token only; a draft is cut before the first token the constraint forbids.
The rejected positions leave the KV cache (``llama_memory_seq_rm``).

Greedy (temperature 0) is a promise: the plain decode's tokens. A batch row's logits are not a
one-token step's (llama.cpp sums them in another order: benchmarks/results/draft-margin-2026-12-07.txt),
so a near-tie can round the other way. Under greedy a row is used only where its top token leads
the runner-up by more than GREEDY_MARGIN; at the first row that does not, verification stops and
the sequence decodes that position alone, one token, as the plain loop does (``GreedyPick``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from localinfer.engine.backend import llama_cpp
from localinfer.engine.draft import DEFAULT_MAX_DRAFT, DraftCosts, NgramDrafter

# ``model`` below is an engine.model.LlamaModel, typed Any: that module imports this one.

if TYPE_CHECKING:
    from localinfer.engine.constrain import ConstraintSampler

# Greedy keeps a batch row's top token only where it leads the runner-up by more than this (logits,
# i.e. nats). Measured (benchmarks/draft_margin.py, results/draft-margin-2026-12-07.txt; 2 threads,
# teacher-forced, 453 rows of verify batches and 84 one-token steps over batch-filled cells per
# model): a row moves its top token's lead over any token within 4 nats of the top by up to 0.44
# (SmolLM2-135M Q4_1) and 1.10 (Gemma-3-270M Q4_K_M: its batches of 4+ rows take a repacked
# kernel) against the one-token step of the plain decode. Twice the larger is the bound: a safety
# factor of 2 for other prompts, depths, quantisations and machines.
MEASURED_DRIFT = 1.1
GREEDY_MARGIN = 2 * MEASURED_DRIFT

Pick = Callable[[int], "int | None"]  # a batch row's token, None where greedy is unsure of it


class GreedyPick:
    """Greedy verification's pick of a batch row (one per context): the token ``chain`` chooses
    there, where it leads every other candidate by more than GREEDY_MARGIN; None otherwise (and the
    chain has accepted nothing). A chain of greedy alone is read on the raw row; one with penalties
    or a constraint is applied by hand as ``llama_sampler_sample`` does (the margin is then on what
    greedy chose from) and accepts the token once it is picked. ``alone`` counts the unsure rows."""

    def __init__(self, ctx: Any, n_vocab: int, margin: float | None = None) -> None:
        import numpy as np

        self._np, self._ctx, self._n = np, ctx, n_vocab
        self.margin = GREEDY_MARGIN if margin is None else margin
        self.alone = 0
        self._cands: Any = None  # candidates for a chain applied by hand, made at its first use

    def pick(self, chain: Any, index: int) -> int | None:
        np = self._np
        ptr = llama_cpp.llama_get_logits_ith(self._ctx, index)
        row = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self._n,))
        if llama_cpp.llama_sampler_chain_n(chain) <= 1:  # greedy alone: the row's top token
            token = int(row.argmax())
            sure = _lead(row, token) > self.margin
        else:
            if self._cands is None:
                self._ids = np.arange(self._n, dtype=np.int32)
                self._cands = np.zeros(self._n, dtype=[("id", np.int32), ("logit", np.float32), ("p", np.float32)])
                data = ctypes.cast(self._cands.ctypes.data, ctypes.POINTER(llama_cpp.llama_token_data))
                self._arr = llama_cpp.llama_token_data_array(data, self._n, -1, False)
            cands, arr = self._cands, self._arr
            cands["id"], cands["logit"] = self._ids, row
            arr.size, arr.selected, arr.sorted = self._n, -1, False
            llama_cpp.llama_sampler_apply(chain, ctypes.byref(arr))
            token = int(cands["id"][arr.selected])
            sure = _lead(cands["logit"][: arr.size], int(arr.selected)) > self.margin
        if not sure:
            self.alone += 1
            return None
        llama_cpp.llama_sampler_accept(chain, token)
        return token


def _lead(values: Any, top: int) -> float:
    """How far ``values[top]`` is above the largest of the others (inf where there is no other)."""
    best = values[top]
    values[top] = -float("inf")  # in place and back: no copy of a 262k-entry row
    try:
        second = values.max() if len(values) > 1 else -float("inf")
    finally:
        values[top] = best
    return float(best - second)


def verify_draft(pick: Pick, draft: Sequence[int], first: int = 0) -> tuple[list[tuple[int, int]], int, bool]:
    """Pick rows ``first``... while the picked token is the drafted one: the tokens to hand out,
    each with its row, how many drafted tokens were kept, and whether every row was sure. Sure: the
    last token is the model's own (at the first disagreement, or after a draft kept whole). Not
    sure: the tokens are the drafted ones kept before the unsure row, and the position that row
    predicts is decoded alone next (its input token - the group's last, or the one before the
    draft where the group is empty - leaves the cache)."""
    group: list[tuple[int, int]] = []
    for j in range(len(draft) + 1):
        token = pick(first + j)
        if token is None:
            return group, j, False
        group.append((token, first + j))
        if j == len(draft) or token != draft[j]:
            return group, j, True
    raise AssertionError("unreachable")


class _VerifyBatch:
    """A ``llama_batch`` of up to ``capacity`` tokens of sequence 0, each row asking for its logits."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.batch = b = llama_cpp.llama_batch_init(capacity, 0, 1)
        self.tok = (llama_cpp.llama_token * capacity).from_address(ctypes.addressof(b.token.contents))
        self.pos = (llama_cpp.llama_pos * capacity).from_address(ctypes.addressof(b.pos.contents))
        (ctypes.c_int8 * capacity).from_address(ctypes.addressof(b.logits.contents))[:] = [1] * capacity
        (ctypes.c_int32 * capacity).from_address(ctypes.addressof(b.n_seq_id.contents))[:] = [1] * capacity
        for i in range(capacity):
            (llama_cpp.llama_seq_id * 1).from_address(ctypes.addressof(b.seq_id[i].contents))[0] = 0

    def fill(self, tokens: Sequence[int], start: int) -> Any:
        n = len(tokens)
        self.tok[:n] = tokens
        self.pos[:n] = range(start, start + n)
        self.batch.n_tokens = n
        return self.batch

    def free(self) -> None:
        llama_cpp.llama_batch_free(self.batch)


def drafter_for(model: Any, history: Sequence[int], costs: DraftCosts | None = None, max_draft: int | None = None,
                min_draft: int = 0) -> NgramDrafter | None:  # fmt: skip
    """A drafter holding ``history`` for the load's draft settings (or a request's ``max_draft`` and
    ``min_draft``), timing its steps into ``costs`` (None: the model's own, kept across answers);
    None where rejected tokens could not leave the cache (recurrent and hybrid models keep a state,
    not per-token cells)."""
    if not model.per_token_cells:
        return None
    if costs is None:
        costs = getattr(model, "draft_costs", None)
        if costs is None:  # kept on the model: the next answer starts with what this one measures
            costs = model.draft_costs = DraftCosts(offloaded(model))
    max_draft = max_draft or model.options.draft_max or DEFAULT_MAX_DRAFT
    if getattr(model, "draft_model", None) is not None:  # a second model guesses (engine/draft_model.py)
        from localinfer.engine.draft_model import ModelDrafter

        return ModelDrafter(model.draft_model, history, max_draft, costs)
    drafter = NgramDrafter(history, max_draft, costs, min_draft)
    drafter.greedy = GreedyPick(model._ctx, model.n_vocab)  # a batch's sequences verify with it
    return drafter


def offloaded(model: Any) -> bool:
    """Whether the model's layers run on a device (DraftCosts then times steps by the wall clock)."""
    layers = getattr(getattr(model, "options", None), "n_gpu_layers", 0)  # the fakes carry no options
    return bool(layers) and bool(llama_cpp.llama_supports_gpu_offload())


def cut_at_constraint(limiter: ConstraintSampler | None, draft: list[int]) -> list[int]:
    """The draft up to its first token the constraint forbids (a forbidden token cannot be kept)."""
    if limiter is None or not limiter.wants_mask or not draft:
        return draft
    try:
        return draft[: int(limiter.matcher.validate_tokens(draft))]
    except Exception:  # noqa: BLE001 - only an optimisation: the sampler enforces the constraint anyway
        return draft
