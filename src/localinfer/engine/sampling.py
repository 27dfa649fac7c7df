"""llama.cpp's native sampler chain, built from our SamplingOptions (the order llama.cpp's own
common sampler uses: penalties (repeat, frequency, presence), then top-k, top-p, min-p, temperature, and the draw).
A constraint (engine/constrain.py) goes right after the penalties, on the whole vocabulary."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from localinfer.engine.backend import llama_cpp
from localinfer.request.sampling import SamplingOptions

if TYPE_CHECKING:
    from localinfer.engine.constrain import ConstraintSampler

# The Python side of each chain's constraint sampler, by chain address: it keeps the ctypes callbacks
# alive as long as the native chain, and answers constraint_of(chain). Freed with the chain.
_constraints: dict[int, ConstraintSampler] = {}


def build_sampler(
    opts: SamplingOptions, n_vocab: int, history: Sequence[int], n_ctx: int, constraint: ConstraintSampler | None = None
) -> tuple[Any, int]:
    """A new sampler chain (the caller frees it with :func:`free_sampler`) and the seed it draws with.
    ``history``: tokens the penalties already count (the prompt); ``n_ctx``: the sequence's context,
    the window of ``repeat_last_n = -1``; ``constraint``: the sequence's own (constrain.sampler_for)."""
    seed = opts.seed if opts.seed is not None else _random_seed()
    # llama.cpp's sampler reads a negative window as 0 (off); its tools turn -1 into the context size.
    last_n = opts.repeat_last_n if opts.repeat_last_n >= 0 else n_ctx
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    add = llama_cpp.llama_sampler_chain_add
    penalize = last_n != 0 and (
        opts.repeat_penalty != 1.0 or opts.frequency_penalty != 0.0 or opts.presence_penalty != 0.0
    )
    if penalize:
        penalties = llama_cpp.llama_sampler_init_penalties(
            n_vocab, last_n, opts.repeat_penalty, opts.frequency_penalty, opts.presence_penalty
        )
        add(chain, penalties)
        for tok in history[-last_n:]:  # into the penalties alone: the prompt is not the constraint's
            llama_cpp.llama_sampler_accept(penalties, tok)
    if constraint is not None:
        constraint.greedy = opts.greedy  # it may then leave the best allowed candidate alone
        add(chain, constraint.sampler)
        _constraints[ctypes.cast(chain, ctypes.c_void_p).value or 0] = constraint
    if opts.greedy:
        add(chain, llama_cpp.llama_sampler_init_greedy())
    else:
        if opts.top_k > 0:
            add(chain, llama_cpp.llama_sampler_init_top_k(opts.top_k))
        if opts.top_p < 1.0:
            add(chain, llama_cpp.llama_sampler_init_top_p(opts.top_p, 1))
        if opts.min_p > 0.0:
            add(chain, llama_cpp.llama_sampler_init_min_p(opts.min_p, 1))
        add(chain, llama_cpp.llama_sampler_init_temp(opts.temperature))
        add(chain, llama_cpp.llama_sampler_init_dist(seed))
    return chain, seed


def constraint_of(chain: Any) -> ConstraintSampler | None:
    """The constraint in ``chain``, if any (its ``complete`` says whether the document is whole)."""
    return _constraints.get(ctypes.cast(chain, ctypes.c_void_p).value or 0)


def free_sampler(chain: Any) -> None:
    _constraints.pop(ctypes.cast(chain, ctypes.c_void_p).value or 0, None)
    llama_cpp.llama_sampler_free(chain)


def _random_seed() -> int:
    """31 random bits from the OS, as secrets.randbits(31) draws them (without importing secrets,
    and hmac with it, on every run's way to its first token)."""
    return int.from_bytes(os.urandom(4), "big") >> 1
