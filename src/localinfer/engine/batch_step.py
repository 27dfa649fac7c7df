"""One step of a BatchDecoder: filling the ``llama_batch`` in sequence id order (next tokens,
fillers for idle ids, prompt chunks), decoding it, and sampling every sequence's row - the
per-token work. ``BatchDecoder`` (engine/batch.py) owns the loop, the admission and the slots.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from localinfer.engine.batch_draft import NO_LAYOUT, plan, verify
from localinfer.engine.logprobs import trim
from localinfer.engine.rows import prompt_chunk
from localinfer.engine.types import SeqResult
from localinfer.errors import GenerationError, ResourceError

if TYPE_CHECKING:
    from localinfer.engine.batch_stats import BatchStats
    from localinfer.engine.draft import DraftCosts
    from localinfer.engine.model import LlamaModel
    from localinfer.engine.slots import Slot, SlotTable


class BatchStep:
    """The per-step half of BatchDecoder (its base class): needs the attributes BatchDecoder sets."""

    model: LlamaModel
    stats: BatchStats
    capacity: int
    n_ctx_seq: int
    fill_gaps: bool
    before_decode: Any
    _batch: Any
    _tok: Any
    _pos: Any
    _out: Any
    _seq: list[Any]
    _fillers: list[int]
    _pads: list[tuple[int, int]]
    _filler: int
    _slots: SlotTable
    _masks: Any
    drafting: bool  # some job drafts (speculative decoding): plan drafts and time the steps
    draft_costs: DraftCosts

    def _fill_and_decode(self, active: list[Slot]) -> bool:
        """Fill the batch in sequence id order and decode it; True if it carried prompt tokens.

        Without a unified KV cache, llama.cpp splits a batch into ubatches of *consecutive* sequence
        ids (``split_equal(..., sequential=true)``), and each ubatch reads all the weights once. So
        each sequence's tokens sit together, in id order, and an idle sequence between two busy
        ones gets a throwaway token (after what it keeps, no logits, removed right after): one
        ubatch for all the next tokens, instead of one per run of consecutive ids. A ubatch also
        takes as many rows of each id, so where sequences draft, the ids of the drafting block all
        get the same number of rows (batch_draft.plan: throwaway rows after a shorter draft). Next
        tokens get room first; prompt chunks share what is left of ``n_batch``, cut so that each of
        their ubatches holds at least ``rows.EXACT_ROWS`` rows (``rows.prompt_chunk``).
        """
        tok, pos, out, seq = self._tok, self._pos, self._out, self._seq
        n_next = 0
        for s in active:
            if s.prompt is None:
                n_next += 1
        prefilling = n_next < len(active)
        fill = self.fill_gaps
        n_ids = active[-1].seq - active[0].seq + 1 if fill else len(active)  # rows in a plain pass
        fillers = self._fillers
        fillers.clear()
        room = self.capacity - n_next - (n_ids - len(active))
        n_drafted, layout = plan(active, room, self.n_ctx_seq, self._slots.filler_pos if fill else None) if self.drafting else (0, NO_LAYOUT)
        room -= n_drafted
        n = 0
        expect = active[0].seq
        pads = self._pads
        pads.clear()
        n_ubatch, rows = self.model.n_ubatch, self._slots.rows
        progress = n_next > 0
        for s in active:
            while fill and expect < s.seq:
                k = 1 + layout.width if layout.lo <= expect <= layout.hi else 1  # as many rows as its neighbours
                n = self._put_throwaway(n, expect, self._slots.filler_pos(expect), k)
                fillers.append(expect)
                expect += 1
            expect = s.seq + 1
            if s.prompt is None:
                tok[n] = s.last
                pos[n] = s.pos + s.shift
                seq[n][0] = s.seq
                out[n] = 1
                s.idx = n
                s.pos += 1
                n += 1
                if s.draft:  # verified in the same decode: a row (with logits) for each drafted token
                    n = self._put_draft(s, n)
                if s.pad:  # to the block's width: rows the decode drops right after
                    pads.append((s.seq, s.pos))
                    n = self._put_throwaway(n, s.seq, s.pos, s.pad)
                continue
            s.idx = -1
            if room > 0:
                left = len(s.prompt) - s.off
                k = prompt_chunk(left, room, n_ubatch, rows)
                if not k and not progress:  # nothing else in this step: the rule gives way
                    k = min(left, room)
                if k:
                    n = self._put_prompt(s, n, k)
                    room -= k
                    progress = True
        if prefilling and n_next:
            self.stats.mixed_steps += 1
        self._batch.n_tokens = n
        if self.before_decode is not None:
            self.before_decode()
        masks = self._masks  # the constrained sequences' next masks: computed during the decode
        if masks is not None:
            masks.start([s.limiter for s in active if s.idx >= 0 and s.limiter is not None])
        t0, c0 = time.perf_counter(), self.draft_costs.clock()
        rc = self.model.decode_batch(self._batch)
        spent = time.perf_counter() - t0
        self.stats.llama_decode_s += spent
        if self.drafting and not prefilling:  # what a step, and a drafted row, cost now
            one_pass = layout.width == 0 or layout.hi - layout.lo + 1 == n_ids
            self.draft_costs.observe(n, self.draft_costs.clock() - c0, n_seqs=n_ids, one_pass=one_pass)
        if masks is not None:
            masks.wait()
        for sid in self._fillers:
            self._slots.drop_filler(sid)
        for sid, at in pads:
            if not self.model.drop_tokens(sid, at):
                raise GenerationError("the KV cache could not drop a step's throwaway rows")
        if rc != 0:
            if rc == 1:
                raise ResourceError(
                    "llama.cpp found no room in the KV cache for this batch",
                    hint="use a larger --ctx-size or a smaller --parallel",
                )
            raise GenerationError(f"llama_decode failed with code {rc}")
        if prefilling:
            for s in active:
                if s.prompt is not None and s.job.on_prompt is not None:
                    s.job.on_prompt(s.stats.cached_tokens, s.off)
        return prefilling

    def _put_prompt(self, s: Slot, n: int, k: int) -> int:
        """Put the next ``k`` prompt tokens of ``s`` at batch row ``n``; the next free row."""
        assert s.prompt is not None
        end = n + k
        self._tok[n:end] = s.prompt[s.off : s.off + k]
        self._pos[n:end] = range(s.pos + s.shift, s.pos + s.shift + k)
        self._out[n:end] = bytes(k)
        sid, seq = s.seq, self._seq
        for i in range(n, end):
            seq[i][0] = sid
        s.off += k
        s.pos += k
        if s.off == len(s.prompt):
            self._out[end - 1] = 1
            s.idx = end - 1
        return end

    def _put_draft(self, s: Slot, n: int) -> int:
        """Put ``s``'s drafted tokens at batch row ``n`` on, each asking for its logits; the next free row."""
        k = len(s.draft)
        end = n + k
        self._tok[n:end] = s.draft
        self._pos[n:end] = range(s.pos, s.pos + k)
        self._out[n:end] = b"\x01" * k
        sid, seq = s.seq, self._seq
        for i in range(n, end):
            seq[i][0] = sid
        s.pos += k
        return end

    def _put_throwaway(self, n: int, sid: int, at: int, k: int) -> int:
        """Put ``k`` throwaway rows of sequence ``sid`` at batch row ``n`` on, at positions ``at`` on
        (an idle id's filler, a draft's padding: no logits, their cells dropped after the decode);
        the next free row."""
        end = n + k
        self._tok[n:end] = [self._filler] * k
        self._pos[n:end] = range(at, at + k)
        self._out[n:end] = bytes(k)
        seq = self._seq
        for i in range(n, end):
            seq[i][0] = sid
        self.stats.filler_tokens += k
        return end

    def _sample(self, active: list[Slot]) -> tuple[list[Slot], int]:
        """Sample one token for every sequence that has logits this step (a drafting sequence: its
        kept drafted tokens and one more); return those that finished, and the tokens sampled."""
        sample = self.model.sample
        clock = time.perf_counter
        take = self._take
        done: list[Slot] = []
        n_sampled = 0
        for s in active:
            if s.idx < 0:
                continue
            if s.draft:
                ended, n = self._verified(s, sample, clock())
                n_sampled += n
                if ended:
                    done.append(s)
                continue
            token = sample(s.chain, s.idx)
            n_sampled += 1
            now = clock()
            st = s.stats
            if s.prompt is not None:  # the prompt's last chunk was just evaluated
                st.prefill_s = now - s.t_admit - st.image_encode_s  # images' encoding apart (engine.batch_media)
                self.stats.prompt_tokens += len(s.prompt) - st.cached_tokens
                s.prompt = None
            if s.n_gen == 0 and st.first_token_s is None:
                s.t_first = now
                st.first_token_s = now - s.t_admit
            if take(s, token, s.idx, now):
                done.append(s)
        return done, n_sampled

    def _take(self, s: Slot, token: int, row: int, now: float) -> bool:
        """Hand ``token`` (sampled from batch row ``row``) to its sequence; True where it ends the answer."""
        st = s.stats
        raw, _, is_eog = self.model.token_out(token)  # cached per token: (bytes, text, eog)
        if is_eog and not s.ignore_eos:
            st.finish_reason = "stop"
            self._flush(s)
            return True
        s.n_gen += 1
        st.completion_tokens = s.n_gen
        st.decode_s = now - s.t_first
        if s.logprobs is not None:  # before the next llama_decode overwrites the row
            s.logprobs.add(row, token)
        text, hit = s.matcher.feed(s.decoder.decode(raw))
        if text:
            s.pieces.append(text)
            if s.emit is not None:
                s.emit(text)
        if hit:
            st.finish_reason, st.stop_string = "stop", s.matcher.matched
            return True
        if (s.max_tokens is not None and s.n_gen >= s.max_tokens) or s.pos >= self.n_ctx_seq:
            st.finish_reason = "length"
            self._flush(s)
            return True
        s.last = token
        s.gen.append(token)
        if s.drafter is not None:
            s.drafter.extend((token,))
        return False

    def _verified(self, s: Slot, sample: Any, now: float) -> tuple[bool, int]:
        """Verify ``s``'s draft and hand out what it keeps (batch_draft.verify); drop the cells of
        what was not kept. Whether the answer ended, and the tokens sampled."""
        draft = s.draft
        base = s.pos - len(draft)  # the position of the first drafted token (``last`` is just before)
        group, kept = verify(s, sample)
        s.draft = []
        s.drafter.feedback(len(draft), kept)
        st = s.stats
        st.draft_tokens, st.draft_accepted, st.draft_steps = s.drafter.drafted, s.drafter.accepted, s.drafter.drafts
        self.stats.draft_tokens += len(draft)
        self.stats.draft_accepted += kept
        ended = False
        for i, (token, row) in enumerate(group):
            s.pos = base + i  # where this token would be evaluated (the context's limit)
            if self._take(s, token, row, now):
                ended = True
                break
        # the cache keeps ``last`` and the drafted tokens handed out before the last one taken:
        # the ending token is never evaluated, a next token is evaluated at the next step
        if s.pos < base + len(draft) and not self.model.drop_tokens(s.seq, s.pos):
            # drafters are made only for caches that drop cells (speculate.drafter_for): never left wrong
            raise GenerationError("the KV cache could not drop the drafted tokens the model did not keep")
        return ended, len(group)

    @staticmethod
    def _flush(s: Slot) -> None:
        tail = s.matcher.flush() + s.decoder.decode(b"", final=True)
        if tail:
            s.pieces.append(tail)
            if s.emit is not None:
                s.emit(tail)

    def _result(self, s: Slot, t_end: float) -> SeqResult:
        s.stats.context_used = s.pos
        text = "".join(s.pieces)
        if s.logprobs is not None:  # aligned with the text returned (a stop string's tokens cut)
            s.stats.logprobs = trim(s.logprobs.entries(), text)
        return SeqResult(s.job.key, text, s.stats, t_admit=s.t_admit, t_end=t_end)
