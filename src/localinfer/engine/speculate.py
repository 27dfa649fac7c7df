"""Speculative decoding on the single-sequence path: the decode loop of ``Model.generate`` when a
drafter (engine/draft.py) is on.

Each step evaluates the last sampled token together with the drafted tokens in one ``llama_decode``
(logits for every row), then samples row after row with the request's own sampler chain and keeps
drafted tokens while they are what was sampled: the first disagreement is the model's own next
token. So every kept token is one the chain drew from the model's distribution given the tokens
before it - greedy gives the plain decode's tokens, sampling follows the target distribution
(speculative sampling for a deterministic drafter: a drafted token is kept with probability
p(token)), and since the chain draws once per answer token, in order, a seed reproduces a run.
Penalties and a constraint advance in the chain's ``accept`` for each kept token only; a draft is
cut before the first token the constraint forbids. The rejected positions leave the KV cache
(``llama_memory_seq_rm``).

Semantics match the plain loop exactly: the token that ends an answer (end of generation, a stop
string, the length limit) is never left in the cache, and neither is anything drafted after it.
"""

from __future__ import annotations

import codecs
import ctypes
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from localinfer.engine.backend import llama_cpp
from localinfer.engine.draft import DEFAULT_MAX_DRAFT, DraftCosts, NgramDrafter
from localinfer.engine.stopping import StopMatcher
from localinfer.engine.types import GenerationStats, Step

# ``model`` below is an engine.model.Model, typed Any: that module imports this one.

if TYPE_CHECKING:
    from localinfer.engine.constrain import ConstraintSampler
    from localinfer.engine.logprobs import Logprobs


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
    raw = model._model
    if llama_cpp.llama_model_is_recurrent(raw) or llama_cpp.llama_model_is_hybrid(raw):
        return None
    if costs is None:
        costs = getattr(model, "draft_costs", None)
        if costs is None:  # kept on the model: the next answer starts with what this one measures
            costs = model.draft_costs = DraftCosts(offloaded(model))
    max_draft = max_draft or model.options.draft_max or DEFAULT_MAX_DRAFT
    if getattr(model, "draft_model", None) is not None:  # a second model guesses (engine/draft_model.py)
        from localinfer.engine.draft_model import ModelDrafter

        return ModelDrafter(model.draft_model, history, max_draft, costs)
    return NgramDrafter(history, max_draft, costs, min_draft)


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


def speculative_loop(
    model: Any,
    chain: Any,
    stats: GenerationStats,
    t_start: float,
    max_tokens: int | None,
    stop: Sequence[str],
    ignore_eos: bool,
    lp: Logprobs | None,
    limiter: ConstraintSampler | None,
    prompt: Sequence[int],
) -> Iterator[Step]:
    """As ``Model._sample_loop``, drafting from ``prompt`` and the answer (the plain loop where the
    model's cache cannot take rejected tokens back: a recurrent model's)."""
    drafter = drafter_for(model, prompt)
    if drafter is None:
        yield from model._sample_loop(chain, stats, t_start, max_tokens, stop, ignore_eos, lp)
        return
    sample, decode, sync = llama_cpp.llama_sampler_sample, llama_cpp.llama_decode, llama_cpp.llama_synchronize
    ctx, one, single, cached = model._ctx, model._one, model._one_batch, model._tokens
    outs, learn = model._outs, model.token_out
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    held = False
    matcher = StopMatcher(stop)
    clock, cost_clock = time.perf_counter, drafter.costs.clock
    n_ctx = model.n_ctx
    limit = max_tokens if max_tokens is not None else n_ctx + 1
    n_gen = 0
    t_first = 0.0
    stats.draft = getattr(drafter, "kind", "ngram")
    if limit <= 0:
        stats.finish_reason = "length"
        return
    verify = _VerifyBatch(drafter.max_draft + 1)
    try:
        group = [(sample(chain, ctx, -1), -1)]  # tokens to hand out: (token, the logits row it came from)
        base = len(cached)  # the KV position of group[0]; all but the group's last token are in the cache
        while True:
            now = clock()
            if n_gen == 0:
                t_first = now
                stats.first_token_s = now - t_start
            end, hit = None, False  # end: the index in ``group`` of the token that ends the answer
            for i, (token, row) in enumerate(group):
                raw, text, eog = outs.get(token) or learn(token)
                if eog and not ignore_eos:
                    stats.finish_reason, end = "stop", i
                    break
                n_gen += 1
                stats.completion_tokens = n_gen
                stats.decode_s = now - t_first
                if lp is not None:
                    lp.add(row, token)
                if text is None or held:
                    text = decoder.decode(raw)
                    held = bool(decoder.getstate()[0])
                text, hit = matcher.feed(text)
                if text or hit:
                    yield Step(text, token)
                if hit:
                    stats.finish_reason, stats.stop_string, end = "stop", matcher.matched, i
                    break
                if n_gen >= limit or base + i >= n_ctx:
                    stats.finish_reason, end = "length", i
                    break
            if end is not None:
                # the ending token and what was drafted after it stay out of the cache, as in the plain loop
                _truncate(model, cached, base + end)
                if hit:
                    return
                break
            token = group[-1][0]
            drafter.extend(t for t, _ in group)
            # drafted tokens past the answer's limit or the context would never be used
            room = min(limit - n_gen - 1, n_ctx - len(cached) - 1)
            draft = cut_at_constraint(limiter, drafter.propose(room)) if room > 0 else []
            t_call, c_call = clock(), cost_clock()
            if draft:
                rc = decode(ctx, verify.fill([token, *draft], len(cached)))
            else:
                one[0] = token
                rc = decode(ctx, single)
            sync(ctx)
            stats.decode_calls_s += clock() - t_call
            drafter.observe(len(draft) + 1, cost_clock() - c_call)
            if rc != 0:
                model._decode_failed(rc)
            cached.append(token)
            base = len(cached)
            if not draft:
                group = [(sample(chain, ctx, -1), -1)]
                continue
            cached.extend(draft)
            group = []
            for row, guess in enumerate(draft):
                chosen = sample(chain, ctx, row)
                group.append((chosen, row))
                if chosen != guess:
                    break
            else:  # all kept: the last row gives the model's own next token
                group.append((sample(chain, ctx, len(draft)), len(draft)))
            kept = len(group) - 1
            drafter.feedback(len(draft), kept)
            stats.draft_tokens, stats.draft_accepted = drafter.drafted, drafter.accepted
            if kept < len(draft) and not _truncate(model, cached, base + kept):
                drafter.stop()  # this cache cannot drop a suffix: no more drafts
        tail = matcher.flush() + decoder.decode(b"", final=True)
        if tail:
            yield Step(tail, None)
    finally:
        stats.draft_tokens, stats.draft_accepted, stats.draft_steps = drafter.drafted, drafter.accepted, drafter.drafts
        verify.free()


def _truncate(model: Any, cached: list[int], n: int) -> bool:
    """Keep the first ``n`` tokens of sequence 0's cache (``cached``, the model's own list). Where
    the cache cannot drop a suffix it is rebuilt from those tokens, and False says so."""
    if n >= len(cached):
        return True
    if model.drop_tokens(0, n):
        del cached[n:]
        return True
    keep = cached[:n]
    llama_cpp.llama_memory_clear(model._mem, True)
    cached.clear()
    model._decode(keep)  # appends to ``cached``: it is the model's list
    return False
