"""One sequence on a loaded model: its KV cache (sequence 0, reused across chat turns) and the
generation of one answer (a base of ``engine.model.LlamaModel``, which loads the model and sets what the
annotations below name).

We drive llama.cpp directly - one batch per decode, the native sampler chain, our own KV-cache
bookkeeping - instead of going through ``llama_cpp.Llama``: it keeps the per-token overhead near
zero, lets us time prefill and decode exactly, and reuse the cache across chat turns.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from localinfer.engine.backend import llama_cpp
from localinfer.engine.logprobs import Logprobs
from localinfer.engine.sampling import build_sampler, free_sampler
from localinfer.engine.rows import prompt_chunk
from localinfer.engine.stopping import StopMatcher
from localinfer.engine.types import GenerationStats, LoadOptions, SeqJob, Step
from localinfer.errors import GenerationError, ResourceError
from localinfer.request.sampling import SamplingOptions

if TYPE_CHECKING:
    from localinfer.request.structured import Format


class SingleSequence:
    """Sequence 0's cache and one answer at a time on it (run, chat, the library API)."""

    options: LoadOptions
    draft_model: Any
    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_vocab: int
    _ctx: Any
    _mem: Any
    _tokens: list[int]
    _one: Any
    _one_batch: Any
    _outs: dict[int, tuple[bytes, str | None, bool]]
    # cells below this are as one-token steps leave them; a drafting answer's batches fill the rest
    # (greedy then checks every pick: _greedy_step), and a chat's next turn reuses them
    _plain_cells: int = 1 << 62

    # -- KV cache of sequence 0 ----------------------------------------------------------------------
    @property
    def cached_tokens(self) -> list[int]:
        return list(self._tokens)

    def reset(self) -> None:
        """Forget everything in the KV cache (a new conversation)."""
        llama_cpp.llama_memory_clear(self._mem, True)
        self._tokens = []
        self._plain_cells = 1 << 62

    def keep_prefix(self, n: int) -> int:
        """Keep only the first ``n`` cached tokens; returns how many are kept (0 where the cache
        cannot drop a suffix). A chat /retry uses it to evaluate its prompt as the first answer did."""
        if n < len(self._tokens):
            if n <= 0 or not llama_cpp.llama_memory_seq_rm(self._mem, 0, n, -1):
                # Some caches (e.g. sliding-window attention) cannot drop a suffix: start over.
                self.reset()
            else:
                del self._tokens[n:]
        return len(self._tokens)

    def _reuse_prefix(self, prompt: Sequence[int]) -> int:
        """Keep the longest cached prefix of ``prompt`` (at least one token is left to evaluate)."""
        n = 0
        limit = min(len(self._tokens), len(prompt) - 1)
        cached = self._tokens
        while n < limit and cached[n] == prompt[n]:
            n += 1
        return self.keep_prefix(n)

    def _decode(self, tokens: Sequence[int]) -> None:
        """Evaluate ``tokens`` on sequence 0, in batches of at most n_batch, cut as serve cuts a prompt
        (``rows.prompt_chunk``: no ubatch of a few rows), so that both give the same logits."""
        start = 0
        while start < len(tokens):
            left = len(tokens) - start
            chunk = tokens[start : start + (prompt_chunk(left, self.n_batch, self.n_ubatch) or min(left, self.n_batch))]
            start += len(chunk)
            arr = (llama_cpp.llama_token * len(chunk))(*chunk)
            rc = llama_cpp.llama_decode(self._ctx, llama_cpp.llama_batch_get_one(arr, len(chunk)))
            if rc != 0:
                self._decode_failed(rc)
            self._tokens.extend(chunk)

    def _decode_failed(self, rc: int) -> NoReturn:
        self._resync()
        if rc == 1:
            raise ResourceError(f"the context is full ({self.n_ctx} tokens)", hint="use a larger --ctx-size")
        raise GenerationError(f"llama_decode failed with code {rc}")

    def _resync(self) -> None:
        """Make our token list agree with the cache after an error or an interruption."""
        n = int(llama_cpp.llama_memory_seq_pos_max(self._mem, 0)) + 1
        if n == len(self._tokens):
            return
        # Ctrl-C usually lands just after a llama_decode returned, before its tokens were recorded:
        # drop that unrecorded tail instead of the whole cache (chat reuses the rest next turn).
        if n > len(self._tokens) > 0 and llama_cpp.llama_memory_seq_rm(self._mem, 0, len(self._tokens), -1):
            return
        self.reset()

    # -- generation ----------------------------------------------------------------------------------
    def generate(
        self,
        prompt: Sequence[int],
        sampling: SamplingOptions,
        stats: GenerationStats,
        *,
        max_tokens: int | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        constraint: Format | None = None,
        constraint_after: str | None = None,
        logprobs: int | None = None,
    ) -> Iterator[Step]:
        """``run`` of a job made from these (the bench's, the probe's and the tests' shorthand)."""
        job = SeqJob(0, prompt, sampling, max_tokens, tuple(stop), ignore_eos, constraint=constraint,
                     constraint_after=constraint_after, logprobs=logprobs)  # fmt: skip
        return self.run(job, stats)

    def run(self, job: SeqJob, stats: GenerationStats) -> Iterator[Step]:
        """Evaluate the job's prompt (reusing the cached prefix) and stream the answer: the batch
        engine's job (``engine.types.SeqJob``), of which one sequence reads what is asked (tokens,
        sampling, max_tokens, stop, ignore_eos, constraint, logprobs); its streaming callbacks and
        cancel are the batch's thread's, here the caller iterates and closes.
        ``constraint``: the answer is this JSON / grammar (from ``constraint_after`` on, if given);
        a format that cannot be compiled raises FormatError before anything is evaluated.
        ``logprobs``, the top N: every counted token's in ``stats.logprobs``.

        ``stats`` is filled in as the stream goes, so a consumer that stops early still has
        correct figures. The last token sampled is not evaluated (nobody needs its logits).
        """
        prompt, sampling, constraint = job.tokens, job.sampling, job.constraint
        if not prompt:
            raise GenerationError("empty prompt: nothing to evaluate")
        t_start = time.perf_counter()
        stats.n_ctx = self.n_ctx
        stats.prompt_tokens = len(prompt)
        stats.finish_reason = None
        limiter = self.constraint_sampler(constraint, job.constraint_after) if constraint is not None else None
        try:
            cached = self._reuse_prefix(prompt)
            t0 = time.perf_counter()
            evaluate = getattr(prompt, "evaluate", None)  # engine.vision.MediaPrompt: images among the tokens
            if evaluate is not None:
                cached = evaluate(self, cached, stats)
                t0 += stats.image_encode_s  # encoding is timed apart from prefill
                prompt = prompt.history
            else:
                self._decode(prompt[cached:])
            stats.cached_tokens = cached
            # GPU backends (CUDA, Metal, RPC) compute asynchronously: llama_decode returns when the
            # work is queued, so the time is taken once it is done (on the CPU this costs nothing)
            llama_cpp.llama_synchronize(self._ctx)
            stats.prefill_s = time.perf_counter() - t0
            chain, seed = build_sampler(sampling, self.n_vocab, prompt, self.n_ctx, limiter)
            stats.extra["seed"] = seed
            lp = self.new_logprobs(job.logprobs) if job.logprobs is not None else None
            out = _Answer(self, stats, t_start, job.max_tokens, job.stop, job.ignore_eos, lp)
            try:
                if self.options.draft is not None or self.draft_model is not None:  # speculative decoding
                    yield from self._draft_loop(chain, out, prompt, limiter, sampling.greedy)
                else:
                    yield from self._sample_loop(chain, out)
            finally:
                if limiter is not None:
                    stats.document = "complete" if limiter.complete else "incomplete"
                free_sampler(chain)
                if lp is not None:
                    stats.logprobs = lp.entries()
        except (KeyboardInterrupt, GeneratorExit):
            stats.finish_reason = stats.finish_reason or "interrupted"
            self._resync()
            raise
        finally:
            stats.context_used = len(self._tokens)

    def _sample_loop(self, chain: Any, out: _Answer) -> Iterator[Step]:
        # The per-token path: it runs with the CPU caches just flushed by llama_decode, so it touches
        # little - one dict lookup per token, the decoder and stop matcher only when a piece needs them.
        sample, decode, sync = llama_cpp.llama_sampler_sample, llama_cpp.llama_decode, llama_cpp.llama_synchronize
        ctx, one, batch, cached = self._ctx, self._one, self._one_batch, self._tokens
        clock = time.perf_counter
        stats = out.stats
        while out.left > 0:
            token = sample(chain, ctx, -1)
            step, ended = out.take(token, -1, len(cached))
            if step is not None:
                yield step
            if ended:
                break
            one[0] = token
            t_call = clock()
            rc = decode(ctx, batch)
            sync(ctx)  # the work itself, not its queueing (see generate); sampling would wait for it anyway
            stats.decode_calls_s += clock() - t_call
            if rc != 0:
                self._decode_failed(rc)
            cached.append(token)
        yield from out.tail()

    def _draft_loop(self, chain: Any, out: _Answer, prompt: Sequence[int], limiter: Any, greedy: bool) -> Iterator[Step]:
        """As ``_sample_loop``, verifying drafts from ``prompt`` and the answer (engine/speculate.py)
        in one batch each: the plain loop where the cache cannot take rejected tokens back (a
        recurrent model's). Under ``greedy`` every pick is the plain loop's (``_greedy_step``)."""
        from localinfer.engine.draft import NgramDrafter
        from localinfer.engine.speculate import GreedyPick, _VerifyBatch, cut_at_constraint, drafter_for, verify_draft

        drafter = drafter_for(self, prompt)
        if drafter is None:
            yield from self._sample_loop(chain, out)
            return
        sample, decode, sync = llama_cpp.llama_sampler_sample, llama_cpp.llama_decode, llama_cpp.llama_synchronize
        ctx, cached, stats = self._ctx, self._tokens, out.stats
        clock, cost_clock = time.perf_counter, drafter.costs.clock
        guard = GreedyPick(ctx, self.n_vocab) if greedy else None
        pick = (lambda i: guard.pick(chain, i)) if guard is not None else (lambda i: int(sample(chain, ctx, i)))
        stats.draft = drafter.kind
        if out.left <= 0:
            return
        verify = _VerifyBatch(drafter.max_draft + 1)
        plain = min(len(cached), self._plain_cells)  # the first cells as one-token steps left them
        try:
            token = sample(chain, ctx, -1)
            group = [(token, -1)]  # tokens to hand out: (token, the logits row it came from)
            base = len(cached)  # the KV position of group[0]; all but the group's last token are in the cache
            alone = False  # decode the next position alone: greedy was unsure of its batch row
            while True:
                for i, (tok, row) in enumerate(group):
                    step, ended = out.take(tok, row, base + i)
                    if step is not None:
                        yield step
                    if ended:  # the ending token and what was drafted after it stay out of the cache
                        self._cut(base + i)
                        yield from out.tail()
                        return
                if group:
                    token = group[-1][0]
                    drafter.extend(t for t, _ in group)
                # drafted tokens past the answer's limit or the context would never be used
                room = min(out.left - 1, self.n_ctx - len(cached) - 1)
                draft = cut_at_constraint(limiter, drafter.propose(room)) if room > 0 and not alone else []
                t_call, c_call = clock(), cost_clock()
                if draft:
                    rc = decode(ctx, verify.fill([token, *draft], len(cached)))
                else:
                    self._one[0] = token
                    rc = decode(ctx, self._one_batch)
                sync(ctx)
                stats.decode_calls_s += clock() - t_call
                drafter.observe(len(draft) + 1, cost_clock() - c_call)
                if rc != 0:
                    self._decode_failed(rc)
                cached.append(token)
                base = len(cached)
                if not draft:
                    plain += plain == base - 1
                    if guard is None or plain == base:
                        group = [(sample(chain, ctx, -1), -1)]
                    else:
                        group, plain = self._greedy_step(chain, guard, plain, stats)
                        if plain == base and isinstance(drafter, NgramDrafter):  # it decoded them again
                            drafter.hold()
                    alone = False
                    continue
                cached.extend(draft)
                group, kept, sure = verify_draft(pick, draft)
                drafter.feedback(len(draft), kept)
                stats.draft_tokens, stats.draft_accepted = drafter.drafted, drafter.accepted
                # unsure: the input token of the unsure row leaves the cache, to be decoded alone
                keep = base - 1 + len(group) if not sure else base + kept
                alone = not sure
                if keep < len(cached) and not self._cut(keep):
                    drafter.stop()  # this cache cannot drop a suffix: no more drafts
                plain = min(plain, len(cached))
        finally:
            stats.draft_tokens, stats.draft_accepted, stats.draft_steps = drafter.drafted, drafter.accepted, drafter.drafts
            if guard is not None:
                stats.extra["draft_alone"] = guard.alone
            self._plain_cells = min(plain, len(cached))
            verify.free()

    def _greedy_step(self, chain: Any, guard: Any, plain: int, stats: GenerationStats) -> tuple[list[tuple[int, int]], int]:
        """Greedy's pick after a one-token step over cells that batches filled (``plain``: the first
        of them). Those cells round apart from what one-token steps leave, and move this step's
        logits as much as a batch row's (benchmarks/results/draft-margin-2026-12-07.txt): so the
        top token is taken only where it leads by GREEDY_MARGIN; at a near-tie the cells from
        ``plain`` on are decoded again one token at a time, and the plain loop's logits decide.
        The token (as a group of one) and the new count of plain cells."""
        token = guard.pick(chain, -1)
        if token is not None:
            return [(token, -1)], plain
        t0 = time.perf_counter()
        redo = self._tokens[plain:]
        self._cut(plain)
        for t in redo:
            self._one[0] = t
            rc = llama_cpp.llama_decode(self._ctx, self._one_batch)
            if rc != 0:
                self._decode_failed(rc)
            self._tokens.append(t)
        llama_cpp.llama_synchronize(self._ctx)
        stats.decode_calls_s += time.perf_counter() - t0
        stats.extra["draft_replayed"] = stats.extra.get("draft_replayed", 0) + len(redo)
        return [(int(llama_cpp.llama_sampler_sample(chain, self._ctx, -1)), -1)], len(self._tokens)

    def _cut(self, n: int) -> bool:
        """Keep the first ``n`` tokens of sequence 0's cache. Where the cache cannot drop a suffix it
        is rebuilt from those tokens, and False says so."""
        if n >= len(self._tokens):
            return True
        if llama_cpp.llama_memory_seq_rm(self._mem, 0, n, -1):
            del self._tokens[n:]
            return True
        keep = self._tokens[:n]
        llama_cpp.llama_memory_clear(self._mem, True)
        self._tokens.clear()  # the same list: the loops hold it
        self._decode(keep)
        return False


class _Answer:
    """One answer's hand-out, the same for the plain and the drafting loop: each sampled token is
    counted, timed, decoded to text through the stop matcher, its log probabilities read from its
    row (before the next llama_decode overwrites it), and checked against the answer's ends."""

    __slots__ = ("stats", "t_start", "t_first", "n_gen", "limit", "n_ctx", "stop", "ignore_eos", "lp", "decoder",
                 "held", "matcher", "outs", "learn", "hit")  # fmt: skip

    def __init__(self, seq: SingleSequence, stats: GenerationStats, t_start: float, max_tokens: int | None,
                 stop: Sequence[str], ignore_eos: bool, lp: Logprobs | None) -> None:  # fmt: skip
        self.stats, self.t_start, self.t_first, self.n_gen = stats, t_start, 0.0, 0
        self.n_ctx = seq.n_ctx
        self.limit = max_tokens if max_tokens is not None else seq.n_ctx + 1
        self.ignore_eos, self.lp = ignore_eos, lp
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.held = False  # the decoder holds the first bytes of a character split across tokens
        self.matcher = StopMatcher(stop)
        self.outs, self.learn = seq._outs, seq.token_out
        self.hit = False
        if self.limit <= 0:
            stats.finish_reason = "length"

    @property
    def left(self) -> int:
        """Tokens the answer may still have (0 once it ended)."""
        return 0 if self.stats.finish_reason is not None else self.limit - self.n_gen

    def take(self, token: int, row: int, pos: int) -> tuple[Step | None, bool]:
        """Hand out ``token``, sampled from batch row ``row``, to be evaluated at cache position
        ``pos``: the step to yield (None: no text yet) and whether the answer ends with it."""
        stats = self.stats
        now = time.perf_counter()
        if self.n_gen == 0:
            self.t_first = now
            stats.first_token_s = now - self.t_start
        raw, text, eog = self.outs.get(token) or self.learn(token)
        if eog and not self.ignore_eos:
            stats.finish_reason = "stop"
            return None, True
        self.n_gen += 1
        stats.completion_tokens = self.n_gen
        stats.decode_s = now - self.t_first
        if self.lp is not None:
            self.lp.add(row, token)
        if text is None or self.held:
            text = self.decoder.decode(raw)
            self.held = bool(self.decoder.getstate()[0])
        text, self.hit = self.matcher.feed(text)
        step = Step(text, token) if text or self.hit else None
        if self.hit:
            stats.finish_reason, stats.stop_string = "stop", self.matcher.matched
        elif self.n_gen >= self.limit or pos >= self.n_ctx:
            stats.finish_reason = "length"
        return step, stats.finish_reason is not None

    def tail(self) -> Iterator[Step]:
        """What the decoder and the stop matcher still hold, once the answer ended (nothing after a
        stop string: the text held back is the stop's)."""
        if self.hit:
            return
        tail = self.matcher.flush() + self.decoder.decode(b"", final=True)
        if tail:
            yield Step(tail, None)
