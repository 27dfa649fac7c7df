"""llama.cpp's native sampler chain, built from our SamplingOptions (the order llama.cpp's own
common sampler uses: penalties (repeat, frequency, presence), then top-k, top-p, min-p, temperature, and the draw)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from localinfer.engine.backend import llama_cpp
from localinfer.engine.types import SamplingOptions


def build_sampler(opts: SamplingOptions, n_vocab: int, history: Sequence[int], n_ctx: int) -> tuple[Any, int]:
    """A new sampler chain (the caller frees it with ``llama_sampler_free``) and the seed it draws with.
    ``history``: tokens the penalties already count (the prompt); ``n_ctx``: the sequence's context,
    the window of ``repeat_last_n = -1``."""
    seed = opts.seed if opts.seed is not None else secrets.randbits(31)
    # llama.cpp's sampler reads a negative window as 0 (off); its tools turn -1 into the context size.
    last_n = opts.repeat_last_n if opts.repeat_last_n >= 0 else n_ctx
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    add = llama_cpp.llama_sampler_chain_add
    penalize = last_n != 0 and (
        opts.repeat_penalty != 1.0 or opts.frequency_penalty != 0.0 or opts.presence_penalty != 0.0
    )
    if penalize:
        add(chain, llama_cpp.llama_sampler_init_penalties(
            n_vocab, last_n, opts.repeat_penalty, opts.frequency_penalty, opts.presence_penalty
        ))  # fmt: skip
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
    if penalize:
        for tok in history[-last_n:]:
            llama_cpp.llama_sampler_accept(chain, tok)
    return chain, seed


def free_sampler(chain: Any) -> None:
    llama_cpp.llama_sampler_free(chain)
