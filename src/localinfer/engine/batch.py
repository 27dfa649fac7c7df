"""Several sequences decoding together in one llama.cpp context, with continuous batching.

One ``llama_batch`` (``llama_batch_init``) carries, at each step, the next token of every sequence
that is generating plus, in the room left (``n_batch``), prompt chunks of sequences that are starting
- as llama-server does. Each sequence keeps its own native sampler chain for its whole life and
samples from its own row of logits (``llama_sampler_sample(chain, ctx, batch_index)``). When a
sequence finishes, its KV cells are dropped (``llama_memory_seq_rm(mem, seq, -1, -1)``) and the next
job takes its slot at once.

With ``keep_cache`` (the server), a finished sequence's cells stay: the next job takes the free slot
whose cache shares the longest prefix with its prompt and evaluates only the rest (llama-server's
``cache_prompt``). A job can stream its text as it comes (``on_text``) and be cancelled from another
thread (``cancel``): its slot is free at the next step.

The context must be created with ``n_seq_max >= n_parallel`` and without a unified KV cache, so each
sequence has its own ``n_ctx_seq`` cells: sequences cannot crowd each other out of the cache, nor
see each other's tokens.

The per-step work (filling the batch, decoding, sampling) is engine/batch_step.py's, the aggregate
figures engine/batch_stats.py's. Per-token Python work is kept small: the batch's arrays are filled
through ctypes array views (slice assignment for prompt chunks), token pieces are cached by the
LlamaModel, nothing is allocated per token but the text pieces themselves.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

from localinfer.engine.backend import llama_cpp
from localinfer.engine.batch_media import MediaSlots
from localinfer.engine.batch_stats import BatchStats
from localinfer.engine.batch_step import BatchStep
from localinfer.engine.draft import DraftCosts
from localinfer.engine.model import LlamaModel
from localinfer.engine.sampling import constraint_of
from localinfer.engine.prompt_cache import PromptCache
from localinfer.engine.slots import Slot, SlotTable
from localinfer.engine.speculate import drafter_for, offloaded
from localinfer.engine.types import GenerationStats, SeqJob, SeqResult
from localinfer.engine.vision import MediaPrompt
from localinfer.errors import GenerationError
from localinfer.request.structured import FormatError

__all__ = ["BatchDecoder", "BatchStats", "SeqJob", "SeqResult"]  # the jobs' types live in engine.types


def _by_seq(slot: Slot) -> int:
    return slot.seq


_END = object()  # the job source is exhausted
MEDIA_WAIT_S = 0.005  # nothing steps but images encode: how long to wait for one before asking for jobs again


class BatchDecoder(BatchStep):
    """Runs jobs ``n_parallel`` at a time on one LlamaModel (its context needs ``n_seq_max >= n_parallel``).

    ``keep_cache``: keep each finished sequence's cells and reuse the longest common prefix (the server).
    """

    def __init__(self, model: LlamaModel, n_parallel: int | None = None, *, keep_cache: bool = False, cache_bytes: int = 0) -> None:
        n_seq_max = model.n_seq_max
        self.n_parallel = n_parallel or n_seq_max
        if not 1 <= self.n_parallel <= n_seq_max:
            raise ValueError(f"n_parallel={self.n_parallel}, but the context holds {n_seq_max} sequences")
        self.model = model
        self.keep_cache = keep_cache
        self.n_ctx_seq = model.n_ctx_seq
        self.capacity = max(model.n_batch, self.n_parallel)
        self.stats = BatchStats()
        self._batch = llama_cpp.llama_batch_init(self.capacity, 0, 1)
        b = self._batch
        cap = self.capacity
        self._tok = (llama_cpp.llama_token * cap).from_address(ctypes.addressof(b.token.contents))
        self._pos = (llama_cpp.llama_pos * cap).from_address(ctypes.addressof(b.pos.contents))
        self._out = (ctypes.c_int8 * cap).from_address(ctypes.addressof(b.logits.contents))
        n_seq_id = (ctypes.c_int32 * cap).from_address(ctypes.addressof(b.n_seq_id.contents))
        n_seq_id[:] = [1] * cap
        # One 1-element seq_id array per batch row (allocated by llama_batch_init).
        self._seq = [(llama_cpp.llama_seq_id * 1).from_address(ctypes.addressof(b.seq_id[i].contents)) for i in range(cap)]
        self._fillers: list[int] = []  # idle sequence ids given a throwaway token this step
        self._pads: list[tuple[int, int]] = []  # (id, position): where a step's throwaway rows after a draft start
        self.fill_gaps = True  # False: leave idle sequences out (one ubatch per run of busy ids)
        self.before_decode: Callable[[], None] | None = None  # called just before each llama_decode
        bos = model.bos_token
        self._filler = bos if bos >= 0 else 0
        self._active: list[Slot] = []  # running sequences, in sequence id order
        # with keep_cache, what an idle sequence would lose is kept in host memory up to cache_bytes
        self.prompt_cache = PromptCache(model, cache_bytes) if keep_cache and cache_bytes > 0 else None
        self._slots = self._new_slots()
        self.drafting = False  # a job drafts (speculative decoding, engine/batch_draft.py)
        self.draft_costs = DraftCosts(offloaded(model))  # what a step and a drafted token cost in this context
        self._masks: Any = None  # a constrain.MaskPrefetch (where it pays), made for the first constrained job
        self._masks_checked = False
        self._media = MediaSlots(model, self.n_parallel)  # slots whose images are being encoded

    def close(self) -> None:
        self._media.close()
        if self._masks is not None:
            self._masks.close()
            self._masks = None
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
            self._tok = self._pos = self._out = None  # type: ignore[assignment]
            self._seq = []

    def __enter__(self) -> BatchDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    def _new_slots(self) -> SlotTable:
        return SlotTable(self.model, self.n_parallel, self.keep_cache, self.prompt_cache)

    # -- figures other threads may read (a server's metrics) ------------------------------------
    @property
    def n_active(self) -> int:
        """Sequences running now (those whose images are being encoded too)."""
        return len(self._active) + len(self._media.pending)

    @property
    def cells_used(self) -> int:
        """KV cells in use: running sequences' and, with keep_cache, what idle slots keep."""
        return sum(s.pos for s in list(self._active)) + self._slots.cells_kept()

    # -- the loop --------------------------------------------------------------------------------
    def run(self, jobs: Iterable[SeqJob | None]) -> Iterator[SeqResult]:
        """Run ``jobs`` (pulled lazily, one each time a slot frees up); yield results as they finish.

        A job whose prompt is empty or does not leave room for one token in ``n_ctx_seq`` is not run:
        its result has ``error`` set. The source may yield None for "no job ready now": the decoder
        goes on with what runs and asks again after the next step - at once when nothing runs, so
        such a source blocks while ``n_active`` is 0. Closing the generator early (or an exception)
        drops every running sequence and leaves the cache empty.
        """
        if self._batch is None:
            raise GenerationError("this batch decoder is closed")
        model = self.model
        model.reset()
        slots = self._slots = self._new_slots()
        source = iter(jobs)
        active = self._active = []
        exhausted = False
        try:
            while True:
                # cancelled sequences end before new jobs come in: a client's retry of a cancelled
                # request (Claude Code's, after a long prefill) finds what it evaluated, not an empty id
                for slot in [s for s in active if s.cancel is not None and s.cancel.is_set()]:
                    slot.stats.finish_reason = "interrupted"
                    active.remove(slot)  # before the next batch is filled: its id may become a gap
                    yield self._retire(slot, time.perf_counter())
                if slots.free and not exhausted:
                    exhausted = yield from self._admit(source, active)
                if self._media.pending:
                    yield from self._media_news(active)
                if not active:
                    if self._media.pending:  # only images being encoded: wait for one (or a new job)
                        self._media.wait(MEDIA_WAIT_S)
                        continue
                    if exhausted:
                        return
                    continue
                done, t_end = self._step(active)
                for slot in done:
                    active.remove(slot)
                    yield self._retire(slot, t_end)
        finally:
            for slot in active + self._media.drop_all():
                if slot.chain is not None:
                    model.free_sampler(slot.chain)
                    slot.chain = None
            self._active = []
            self._slots = self._new_slots()
            if not model.closed:
                model.reset()

    def _admit(self, source: Iterator[SeqJob | None], active: list[Slot]) -> Generator[SeqResult, None, bool]:
        """Give free slots to the next jobs; yield refused jobs' results; return True once the
        source is exhausted."""
        clock = time.perf_counter
        exhausted = admitted = False
        while self._slots.free:
            job = next(source, _END)
            if job is _END:
                exhausted = True
                break
            if job is None:
                break
            assert isinstance(job, SeqJob)
            problem, limiter = self._refuse(job), None
            if problem is None and job.constraint is not None:
                try:
                    limiter = self.model.constraint_sampler(job.constraint, job.constraint_after)
                except FormatError as exc:
                    problem = str(exc)
            if problem is not None:
                yield SeqResult(job.key, "", GenerationStats(prompt_tokens=len(job.tokens)), error=problem)
                continue
            if job.max_tokens is not None and job.max_tokens <= 0:
                now = clock()
                stats = GenerationStats(prompt_tokens=len(job.tokens), finish_reason="length", n_ctx=self.n_ctx_seq)
                yield SeqResult(job.key, "", stats, t_admit=now, t_end=now)
                continue
            seq, cached = self._slots.take(job.tokens, reuse=job.cache_prompt)
            chain, seed = self.model.new_sampler(job.sampling, getattr(job.tokens, "history", job.tokens), limiter)  # engine.vision's: text alone
            slot = Slot(seq, job, chain, clock(), cached, self.model)
            if limiter is not None:
                slot.limiter = limiter
                if not self._masks_checked:
                    from localinfer.engine.constrain import mask_prefetch

                    self._masks, self._masks_checked = mask_prefetch(self.model, self.n_parallel), True
            if job.draft_max != 0 and (job.draft or (job.draft is None and self.model.options.draft is not None)):
                slot.drafter = drafter_for(self.model, job.tokens, self.draft_costs, job.draft_max, job.draft_min)
                if slot.drafter is not None:
                    self.drafting = True
                    slot.stats.draft = "ngram"
            slot.stats.n_ctx = self.n_ctx_seq
            slot.stats.extra["seed"] = seed
            self.stats.cached_tokens += cached
            if job.on_prompt is not None:
                job.on_prompt(cached, cached)
            if isinstance(job.tokens, MediaPrompt):  # its images encode off this thread; it joins when decoded
                error = self._media.admit(slot, self._slots)
                if error is not None:
                    yield self._retire(slot, clock(), error)
                continue
            active.append(slot)
            admitted = True
        if admitted:
            active.sort(key=_by_seq)
            self.stats.max_active = max(self.stats.max_active, len(active))
        return exhausted

    def _media_news(self, active: list[Slot]) -> Iterator[SeqResult]:
        """Slots whose images are encoded join ``active`` (decoded into their sequences now); those
        cancelled or failed meanwhile end."""
        joined, ended = self._media.news(self._slots)
        if joined:
            active.extend(joined)
            active.sort(key=_by_seq)
            self.stats.max_active = max(self.stats.max_active, len(active))
        for slot, error in ended:
            yield self._retire(slot, time.perf_counter(), error)

    def _retire(self, s: Slot, t_end: float, error: str | None = None) -> SeqResult:
        """Free a finished sequence's slot (the table keeps or drops its cells) and give its result
        (``error``: it failed before it ran)."""
        limiter = constraint_of(s.chain)
        if limiter is not None:
            s.stats.document = "complete" if limiter.complete else "incomplete"
        self.model.free_sampler(s.chain)
        s.chain = None
        self._slots.release(s)
        result = self._result(s, t_end)
        if error is not None:
            result.error = error
        return result

    def _refuse(self, job: SeqJob) -> str | None:
        n = len(job.tokens)
        if n == 0:
            return "empty prompt: nothing to evaluate"
        if n >= self.n_ctx_seq:
            return f"the prompt ({n} tokens) does not fit the context of one sequence ({self.n_ctx_seq} tokens)"
        return None

    def _step(self, active: list[Slot]) -> tuple[list[Slot], float]:
        """One decode of every running sequence; the sequences that finished, and when."""
        clock = time.perf_counter
        st = self.stats
        t_step = clock()
        t_llama = st.llama_decode_s
        has_prompt = self._fill_and_decode(active)
        done, n_sampled = self._sample(active)
        t_end = clock()
        st.steps += 1
        st.sampled_tokens += n_sampled
        if not has_prompt:
            st.decode_only_steps += 1
            st.decode_only_s += t_end - t_step
            st.decode_only_llama_s += st.llama_decode_s - t_llama
            st.decode_only_tokens += n_sampled
        return done, t_end
