"""One sequence on a loaded model: its KV cache (sequence 0, reused across chat turns) and the
generation of one answer (a base of ``engine.model.Model``, which loads the model and sets what the
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
from localinfer.engine.stopping import StopMatcher
from localinfer.engine.types import GenerationStats, LoadOptions, Step
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
    n_vocab: int
    _ctx: Any
    _mem: Any
    _tokens: list[int]
    _one: Any
    _one_batch: Any
    _outs: dict[int, tuple[bytes, str | None, bool]]

    # -- KV cache of sequence 0 ----------------------------------------------------------------------
    @property
    def cached_tokens(self) -> list[int]:
        return list(self._tokens)

    def reset(self) -> None:
        """Forget everything in the KV cache (a new conversation)."""
        llama_cpp.llama_memory_clear(self._mem, True)
        self._tokens = []

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
        """Evaluate ``tokens`` on sequence 0, in batches of at most n_batch."""
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
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
        """Evaluate ``prompt`` (reusing the cached prefix) and stream the answer.
        ``constraint``: the answer is this JSON / grammar (from ``constraint_after`` on, if given);
        a format that cannot be compiled raises FormatError before anything is evaluated.
        ``logprobs``, the top N: every counted token's in ``stats.logprobs``.

        ``stats`` is filled in as the stream goes, so a consumer that stops early still has
        correct figures. The last token sampled is not evaluated (nobody needs its logits).
        """
        if not prompt:
            raise GenerationError("empty prompt: nothing to evaluate")
        t_start = time.perf_counter()
        stats.n_ctx = self.n_ctx
        stats.prompt_tokens = len(prompt)
        stats.finish_reason = None
        limiter = self.constraint_sampler(constraint, constraint_after) if constraint is not None else None
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
            lp = self.new_logprobs(logprobs) if logprobs is not None else None
            try:
                if self.options.draft is not None or self.draft_model is not None:  # speculative decoding (engine/speculate.py)
                    from localinfer.engine.speculate import speculative_loop

                    yield from speculative_loop(self, chain, stats, t_start, max_tokens, stop, ignore_eos, lp, limiter, prompt)
                else:
                    yield from self._sample_loop(chain, stats, t_start, max_tokens, stop, ignore_eos, lp)
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

    def _sample_loop(
        self,
        chain: Any,
        stats: GenerationStats,
        t_start: float,
        max_tokens: int | None,
        stop: Sequence[str],
        ignore_eos: bool,
        lp: Logprobs | None = None,
    ) -> Iterator[Step]:
        # The per-token path: it runs with the CPU caches just flushed by llama_decode, so it touches
        # little - one dict lookup per token, the decoder and stop matcher only when a piece needs them.
        sample, decode, sync = llama_cpp.llama_sampler_sample, llama_cpp.llama_decode, llama_cpp.llama_synchronize
        ctx, one, batch, cached = self._ctx, self._one, self._one_batch, self._tokens
        outs, learn = self._outs, self.token_out
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        held = False  # the decoder holds the first bytes of a character split across tokens
        matcher = StopMatcher(stop)
        clock = time.perf_counter
        n_ctx = self.n_ctx
        limit = max_tokens if max_tokens is not None else n_ctx + 1
        n_gen = 0
        t_first = 0.0
        if limit <= 0:
            stats.finish_reason = "length"
            return
        while True:
            token = sample(chain, ctx, -1)
            now = clock()
            if n_gen == 0:
                t_first = now
                stats.first_token_s = now - t_start
            raw, text, eog = outs.get(token) or learn(token)
            if eog and not ignore_eos:
                stats.finish_reason = "stop"
                break
            n_gen += 1
            stats.completion_tokens = n_gen
            stats.decode_s = now - t_first
            if lp is not None:  # before the next llama_decode overwrites the row
                lp.add(-1, token)
            if text is None or held:
                text = decoder.decode(raw)
                held = bool(decoder.getstate()[0])
            text, hit = matcher.feed(text)
            if text or hit:
                yield Step(text, token)
            if hit:
                stats.finish_reason, stats.stop_string = "stop", matcher.matched
                return
            if n_gen >= limit or len(cached) >= n_ctx:
                stats.finish_reason = "length"
                break
            one[0] = token
            t_call = clock()
            rc = decode(ctx, batch)
            sync(ctx)  # the work itself, not its queueing (see generate); sampling would wait for it anyway
            stats.decode_calls_s += clock() - t_call
            if rc != 0:
                self._decode_failed(rc)
            cached.append(token)
        tail = matcher.flush() + decoder.decode(b"", final=True)
        if tail:
            yield Step(tail, None)
