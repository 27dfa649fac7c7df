"""The sequences of a BatchDecoder: one running job's state (``Slot``), and which sequence ids are
free and what each idle one's KV cells still hold (``SlotTable``, for prefix reuse)."""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from localinfer.engine.rows import EXACT_ROWS
from localinfer.engine.stopping import StopMatcher
from localinfer.engine.types import GenerationStats, SeqJob
from localinfer.engine.vision import MediaPrompt

if TYPE_CHECKING:
    from localinfer.engine.logprobs import Logprobs
    from localinfer.engine.model import LlamaModel


class Slot:
    """One running sequence (slot number = llama.cpp sequence id)."""

    __slots__ = (
        "seq", "job", "chain", "pos", "prompt", "off", "idx", "last", "n_gen", "decoder", "matcher",
        "pieces", "stats", "t_admit", "t_first", "max_tokens", "ignore_eos", "gen", "emit", "cancel", "logprobs",
        "limiter", "drafter", "draft", "pad", "shift",
    )

    def __init__(self, seq: int, job: SeqJob, chain: Any, now: float, cached: int = 0, model: LlamaModel | None = None) -> None:
        self.seq = seq
        self.job = job
        self.chain = chain
        self.pos = cached  # next cell to fill = tokens in this sequence's cache
        self.shift = 0  # a cell's position minus its index (after M-RoPE images: engine.vision.MediaPrompt.shift)
        self.prompt: list[int] | None = list(job.tokens)  # None once the prompt is evaluated
        self.off = cached  # prompt tokens already in the cache or put in a batch
        self.idx = -1  # this step: batch index of the row to sample from, -1 = none
        self.last = -1  # last sampled token, to evaluate next step
        self.n_gen = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.matcher = StopMatcher(job.stop)
        self.pieces: list[str] = []
        self.stats = GenerationStats(prompt_tokens=len(self.prompt), cached_tokens=cached)
        self.t_admit = now
        self.t_first = 0.0
        self.max_tokens = job.max_tokens
        self.ignore_eos = job.ignore_eos
        self.gen: list[int] = []  # sampled tokens that go into the cache (what a SlotTable keeps)
        self.emit = job.on_text
        self.cancel = job.cancel
        self.logprobs: Logprobs | None = None
        self.limiter: Any = None  # its constraint (engine.constrain.ConstraintSampler), in the chain
        self.drafter: Any = None  # an engine.draft.NgramDrafter where this sequence drafts (batch_draft.py)
        self.draft: list[int] = []  # this step's drafted tokens, in the batch after ``last``
        self.pad = 0  # this step's throwaway rows after them (batch_draft.plan), dropped after the decode
        if job.logprobs is not None:
            assert model is not None, "a job asking for logprobs needs the model"
            self._track_logprobs(model, job)

    def _track_logprobs(self, model: LlamaModel, job: SeqJob) -> None:
        """Read each token's log probabilities; ``on_logprobs`` streams them with their text."""
        lp = self.logprobs = model.new_logprobs(job.logprobs or 0)
        hand_on = job.on_logprobs
        if hand_on is None:
            return
        sent = [0]  # bytes of text emitted so far

        def emit_with_logprobs(text: str) -> None:
            sent[0] += len(text.encode("utf-8", errors="surrogatepass"))
            hand_on(text, lp.take(sent[0]))

        self.emit = emit_with_logprobs

    def cached_tokens(self) -> list[int]:
        """The tokens this sequence's cells hold, in order."""
        tokens = self.job.tokens
        if self.pos <= len(tokens):
            return list(tokens[: self.pos])
        return [*tokens, *self.gen[: self.pos - len(tokens)]]


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the common prefix of ``a`` and ``b``, at most ``limit``; whole chunks compared in C."""
    n = min(len(a), len(b), limit)
    i, step = 0, 256
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _complete(model: LlamaModel, seq: int) -> bool:
    """Whether ``seq`` still holds its first positions: a sliding-window cache forgets old cells,
    and a prefix without them cannot be reused (llama-server re-evaluates the prompt then too)."""
    return model.first_position(seq) <= 0


class SlotTable:
    """Free sequence ids and, with ``keep_cache``, the tokens each idle one still holds.

    Without keep_cache a finished sequence's cells are dropped and the lowest free id goes first
    (running sequences stay packed: fewer fillers). With it the cells stay, and a new prompt takes
    the slot sharing its longest prefix - on a tie an empty slot, else the one idle longest, as
    llama-server picks.
    """

    def __init__(self, model: LlamaModel, n_parallel: int, keep_cache: bool, cache: Any = None) -> None:
        self.model = model
        self.keep_cache = keep_cache
        # host memory for what an idle sequence loses (an engine.prompt_cache.PromptCache, which imports this module)
        self.cache = cache if keep_cache else None
        self.n_ctx_seq = model.n_ctx_seq
        # a hit leaves at least this many prompt tokens to evaluate (EXACT_ROWS); where cells cannot be
        # dropped (a recurrent state) the old rule: one token, and the answer's cells kept too (_rows)
        self.rows = EXACT_ROWS if model.per_token_cells else 1
        self.free = list(range(n_parallel))
        self.kept: list[list[int]] = [[] for _ in range(n_parallel)]
        self._used = [-1] * n_parallel  # when each idle slot's job ended (-1: empty)
        self._clock = 0

    def take(self, tokens: Sequence[int], reuse: bool = True) -> tuple[int, int]:
        """A free sequence id for ``tokens``, and how many of them its cells already hold (none
        without ``reuse``: the whole prompt is evaluated, in an empty slot if there is one)."""
        if not self.keep_cache:
            seq = min(self.free)
            self.free.remove(seq)
            return seq, 0
        limit = max(0, len(tokens) - self._rows(tokens)) if reuse else 0  # its last rows evaluated as a cold prompt's
        seq, best = self.free[0], (-1, 0)
        for sid in self.free:
            key = (common_prefix(self.kept[sid], tokens, limit), -self._used[sid])
            if key > best:
                seq, best = sid, key
        n = best[0]
        entry, m = self.cache.longest(tokens, limit) if self.cache is not None else (None, 0)
        if entry is not None and m > n:  # host memory holds more of it: into the coldest id
            self.cache.touch(entry)  # not the one to make room for what that id holds now
            seq = max(self.free, key=lambda sid: (not self.kept[sid], -self._used[sid]))
            self.free.remove(seq)
            self._clear(seq, keep=0)
            return seq, m if self.cache.restore(seq, entry, m) else 0
        self.free.remove(seq)
        n = self._clear(seq, keep=n)
        return seq, n

    def _clear(self, seq: int, keep: int) -> int:
        """``seq``'s cells past its first ``keep`` dropped (the host cache takes them first where most
        would go); how many it still holds. Its cells then belong to the running job (its pos counts them)."""
        kept = self.kept[seq]
        if kept and (keep == 0 or not _complete(self.model, seq) or keep < len(kept)):
            if self.cache is not None and keep < len(kept) // 2 and _complete(self.model, seq):
                self.cache.save(seq, kept)
            if keep == 0 or not _complete(self.model, seq) or not self.model.drop_tokens(seq, keep):
                self.model.drop_sequence(seq)
                keep = 0
        self.kept[seq] = []
        return keep

    def release(self, slot: Slot) -> None:
        """A sequence finished: keep its cells (keep_cache) or drop them; its id is free again."""
        self._clock += 1
        kept = self._reusable(slot) if self.keep_cache else []
        # A kept sequence still needs one free cell: the place of a filler token.
        if kept and len(kept) < self.n_ctx_seq and (len(kept) == slot.pos or self.model.drop_tokens(slot.seq, len(kept))):
            self.kept[slot.seq] = kept
            self._used[slot.seq] = self._clock
        else:
            self._forget(slot.seq)
        self.free.append(slot.seq)

    def _reusable(self, slot: Slot) -> list[int]:
        """What a later prompt may reuse of ``slot``'s cells: its prompt's, evaluated in pieces of
        ``rows`` (not a shorter prompt's, nor the answer's); all of them where cells cannot be dropped."""
        tokens = slot.job.tokens
        rows = self._rows(tokens)
        if rows == 1:
            return slot.cached_tokens()
        return list(tokens[: min(slot.pos, len(tokens))]) if len(tokens) >= rows else []

    def _rows(self, tokens: Sequence[int]) -> int:
        # a prompt with images is evaluated in the pieces its images cut (engine.vision), not in ``rows``:
        # the old rule for it, which keeps an image's cells for the next turn instead of encoding it again
        return 1 if isinstance(tokens, MediaPrompt) else self.rows

    def hold(self, seq: int, tokens: list[int]) -> None:
        """A taken id whose job waits (its images encode: engine/batch_media.py) keeps ``tokens``
        meanwhile: an idle id's filler goes after them."""
        self.kept[seq] = tokens

    def unhold(self, seq: int) -> int:
        """The job of a held id runs (or ends): how many positions the id still holds."""
        n = len(self.kept[seq])
        self.kept[seq] = []
        return n

    def filler_pos(self, seq: int) -> int:
        """Where an idle sequence's throwaway token goes: right after what it keeps."""
        return len(self.kept[seq])

    def drop_filler(self, seq: int) -> None:
        kept = self.kept[seq]
        if not kept or not self.model.drop_tokens(seq, len(kept)):
            self._forget(seq)  # a cache that cannot drop one cell (sliding window) loses what it kept

    def cells_kept(self) -> int:
        return sum(len(k) for k in list(self.kept))

    def _forget(self, seq: int) -> None:
        self.model.drop_sequence(seq)
        self.kept[seq] = []
        self._used[seq] = -1
