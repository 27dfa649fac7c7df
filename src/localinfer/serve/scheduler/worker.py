"""The server's engine: one thread owns the model and runs every request through one BatchDecoder.

Requests come in through a thread-safe queue (``submit``); a request arriving while others decode
joins them at the next step, in the slot whose KV cache shares the longest prefix with its prompt
(the next turn of a chat evaluates only its new tokens). Text goes out through each request's
``on_text`` as it is sampled, and its ``Ended`` through ``on_end``; both are called on the engine
thread, so they must be quick (``bridge`` hands them to the event loop). Cancelling a request frees
its sequence at the next step.

Embedding requests (``submit_embed``) run on the same thread, in an embedding context beside the
generation one (made on first use), one embedding decode (a batch of the first request's inputs)
before each decoding step - or one after another when nothing decodes (a marker in the queue wakes
the thread), a chat request arriving between two: llama.cpp never runs two decodes at once on our
model, an embedding needs no sequence, and a 2,048-input request never holds the streams (nor runs
on once cancelled: its ticket is looked at before each of its decodes).

This module is the scheduler; a request is made ready to queue in ``serve.scheduler.prepare``, its answer
assembled (thinking, tool calls, the ``Ended``) in ``serve.scheduler.outcome``, and the embedding requests'
tickets and decodes are ``serve.scheduler.embed_queue``'s.
"""

from __future__ import annotations

import collections
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from localinfer.serve.scheduler.embed_queue import EmbedOutcome, EmbedTicket, embed_step
from localinfer.serve.scheduler.outcome import Ended, failed, feeder, finished
from localinfer.serve.scheduler.prepare import Prepared, prepare
from localinfer.serve.wires.openai import Envelope

if TYPE_CHECKING:
    from localinfer.engine.batch import BatchDecoder, SeqJob, SeqResult
    from localinfer.engine.embed import Embedder
    from localinfer.generate.finish import Finish, Step
    from localinfer.generate.loading import LoadedModel

__all__ = ["EmbedOutcome", "EmbedTicket", "Engine", "Ended", "Overloaded", "Prepared", "Ticket"]


_WAKE = object()  # in the queue: embedding requests are waiting (``Engine._embeds``)


class Overloaded(Exception):
    """The queue of requests waiting for a slot is full."""


class Ticket:
    """One submitted request, as its owner holds it: ``cancel()`` may be called from any thread."""

    __slots__ = ("key", "job", "t_arrival", "on_end", "cancelled", "prepared", "finish", "live", "on_steps")

    def __init__(self, key: int, job: SeqJob, prepared: Prepared, on_end: Callable[[Ended], None], finish: Finish,
                 live: bool = False, on_steps: Callable[[list[Step]], None] | None = None) -> None:  # fmt: skip
        self.key, self.job, self.prepared, self.on_end = key, job, prepared, on_end
        self.finish, self.live, self.on_steps = finish, live, on_steps  # live: fed piece by piece (else at the end)
        self.t_arrival = time.perf_counter()
        self.cancelled = job.cancel  # the decoder checks it at every step

    def cancel(self) -> None:
        assert self.cancelled is not None
        self.cancelled.set()


class Engine:
    """Owns ``loaded`` (a context of ``parallel`` sequences) and the thread that decodes for everyone."""

    def __init__(
        self, loaded: LoadedModel, parallel: int, *, max_queue: int,
        on_finish: Callable[[Ticket, Ended], None] | None = None, on_step: Callable[[], None] | None = None,
        template_kwargs: dict[str, Any] | None = None, n_predict: int = -1,
        embed_ctx: int = 512, on_embedded: Callable[[EmbedOutcome], None] | None = None, cache_bytes: int = 0,
    ) -> None:  # fmt: skip
        """``on_step``: called on the engine thread just before each ``llama_decode`` and after each
        request ends - where its callbacks' news may be handed on (``bridge.Hub.flush``).
        ``embed_ctx``: the embedding context's tokens per decode (the longest input); ``on_embedded``:
        called on the engine thread after each embedding request (the usage history); ``n_predict``:
        serve's -n, the cap of an answer whose request names none."""
        self.loaded = loaded
        self.parallel = parallel
        self.max_queue = max_queue
        self.template_kwargs = template_kwargs or {}  # --chat-template-kwargs: a request's own win, key by key
        self.n_predict = n_predict
        self.n_ctx_seq = loaded.model.n_ctx_seq
        self._on_finish = on_finish
        self._on_step = on_step
        self.embed_ctx = embed_ctx
        self.cache_bytes = cache_bytes  # host memory for idle sequences' cells (engine.prompt_cache)
        self._on_embedded = on_embedded
        self._embedder: Embedder | None = None  # made by the engine thread on first use
        self._queue: queue.Queue[Ticket | object | None] = queue.Queue()
        self._embeds: collections.deque[EmbedTicket] = collections.deque()
        self._running: dict[int, Ticket] = {}
        self._keys = itertools.count()
        self._decoder: BatchDecoder | None = None
        self._thread = threading.Thread(target=self._loop, name="localinfer-engine", daemon=True)

    # -- what the HTTP side calls --------------------------------------------------------------------
    def prepare(self, request: Envelope, *, clamp: bool = False) -> Prepared:
        """``serve.scheduler.prepare.prepare`` on this engine's model and context (any thread)."""
        return prepare(self.loaded, self.n_ctx_seq, self.template_kwargs, request, clamp=clamp, n_predict=self.n_predict)

    def submit(
        self, prepared: Prepared, on_text: Callable[[str], None] | None, on_end: Callable[[Ended], None],
        on_logprobs: Callable[[str, list], None] | None = None,
        on_steps: Callable[[list[Step]], None] | None = None, on_prompt: Callable[[int, int], None] | None = None,
    ) -> Ticket:  # fmt: skip
        """Queue a request. Its answer streams as raw text pieces (``on_text``: the fast path of an
        answer that is all text), as pieces with their logprobs (``on_logprobs``: thinking stays
        inline), or as typed steps (``on_steps``: thinking, text, tool calls - ``localinfer.generate.finish``);
        all None: wanted only at the end. ``on_prompt``: the prompt's progress (``SeqJob.on_prompt``).
        ``Overloaded`` when more than ``max_queue`` would wait."""
        if self._waiting_chats() - (self.parallel - self.running) >= self.max_queue:
            raise Overloaded()
        finish = prepared.finish(split=on_logprobs is None)
        live = on_steps is not None or finish.splits  # thinking is counted piece by piece
        asked = prepared.asked
        job = prepared.job(
            next(self._keys), on_text=feeder(finish, on_text, on_steps) if live else on_text, cancel=threading.Event(),
            cache_prompt=asked.cache_prompt, on_logprobs=on_logprobs, draft_max=asked.draft_max, draft_min=asked.draft_min,
            on_prompt=on_prompt,
        )  # fmt: skip
        ticket = Ticket(job.key, job, prepared, on_end, finish, live, on_steps)
        self._queue.put(ticket)
        return ticket

    def submit_embed(self, inputs: list[list[int]], on_end: Callable[[EmbedOutcome], None]) -> EmbedTicket:
        """Queue an embedding request (token lists that fit ``embed_ctx``); ``Overloaded`` when
        ``max_queue`` of them wait already."""
        if len(self._embeds) >= self.max_queue:
            raise Overloaded()
        ticket = EmbedTicket(inputs, on_end)
        self._embeds.append(ticket)
        self._queue.put(_WAKE)
        return ticket

    def _waiting_chats(self) -> int:
        return sum(t is not _WAKE and t is not None for t in list(self._queue.queue))

    # -- figures (any thread) --------------------------------------------------------------------------
    @property
    def vision(self) -> bool:
        """Loaded with a projector: takes images."""
        return self.loaded.projector is not None

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def queued(self) -> int:
        return self._waiting_chats() + len(self._embeds)

    @property
    def cells_used(self) -> int:
        decoder = self._decoder
        return decoder.cells_used if decoder is not None else 0

    @property
    def prompt_cache(self) -> Any:
        """The host prompt cache's figures (engine.prompt_cache.CacheStats), or None without one."""
        decoder = self._decoder
        cache = decoder.prompt_cache if decoder is not None else None
        return cache.stats if cache is not None else None

    @property
    def cells_total(self) -> int:
        return self.n_ctx_seq * self.parallel

    # -- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def cancel_all(self) -> None:
        """Cancel every running and waiting request (their answers end as ``interrupted``)."""
        for ticket in list(self._running.values()) + list(self._queue.queue) + list(self._embeds):
            if isinstance(ticket, (Ticket, EmbedTicket)):
                ticket.cancel()  # an embedding request cancelled is answered as an error

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel what is left, end the engine thread and free the model."""
        self.cancel_all()
        self._queue.put(None)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            if self._embedder is not None:
                self._embedder.close()  # before the model it was made on
            self.loaded.close()

    # -- the engine thread ------------------------------------------------------------------------------
    def _loop(self) -> None:
        from localinfer.engine.batch import BatchDecoder

        while True:
            try:
                with BatchDecoder(self.loaded.model, self.parallel, keep_cache=True, cache_bytes=self.cache_bytes) as decoder:
                    decoder.before_decode = self._before_decode
                    self._decoder = decoder
                    for result in decoder.run(self._source(decoder)):
                        self._finish(result)
                return  # the stop sentinel came
            except Exception as exc:
                _report(exc)
                for ticket in list(self._running.values()):
                    self._end(ticket, _failed(ticket, f"the engine failed: {type(exc).__name__}: {exc}"))
                self._running.clear()
                time.sleep(0.1)  # a failure that repeats at once does not spin
            finally:
                self._decoder = None

    def _source(self, decoder: BatchDecoder) -> Iterator[SeqJob | None]:
        """The decoder's jobs: waits while nothing runs, else None when nobody is waiting.

        Every request queued when a step is filled goes into it, and one that comes later into the
        next step - llama-server's policy: no step waits for a request not yet queued. An idle engine
        used to wait for the rest of a burst (up to 50 ms); but prefill costs about the same per token
        in one batch or two, so waiting only made the burst's first requests wait for the last ones'
        prompts too (benchmarks/results/serve-8clients-2026-12-07.txt: TTFT p50 1.50x
        llama-server's, which started each group of a burst as it came).
        """
        while True:
            if decoder.n_active == 0 and self._embeds and self._queue.empty():
                self._embed_step()  # idle: the embeddings' decodes one by one, a chat request may come between
                continue
            try:
                ticket = self._queue.get() if decoder.n_active == 0 else self._queue.get_nowait()
            except queue.Empty:
                yield None
                continue
            if ticket is None:
                self._run_embeds()  # cancelled by stop(): answered, not left waiting
                return
            if ticket is _WAKE:
                continue  # the loop's top (idle) or the next step's before_decode takes it
            if ticket.cancelled is not None and ticket.cancelled.is_set():
                self._end(ticket, _failed(ticket, None, "interrupted"))
                continue
            self._running[ticket.key] = ticket
            yield ticket.job

    def _before_decode(self) -> None:
        if self._embeds:
            self._embed_step()
        if self._on_step is not None:
            self._on_step()

    def _run_embeds(self) -> None:
        """End every waiting embedding request (at stop: they are cancelled, so each ends at once)."""
        while self._embeds:
            self._embed_step()

    def _embed_step(self) -> None:
        """One embedding decode (``embed_queue.embed_step``); its request ends here when it is over."""
        ended = embed_step(self._embeds, self._embedder_made)
        if ended is not None:
            self._end(*ended)

    def _embedder_made(self) -> Embedder:
        from localinfer.engine.embed import Embedder

        if self._embedder is None:
            self._embedder = Embedder(self.loaded.model, n_ctx=self.embed_ctx)
        return self._embedder

    def _finish(self, result: SeqResult) -> None:
        ticket = self._running.pop(result.key)
        if result.error is not None:
            self._end(ticket, _failed(ticket, result.error))
            return
        self._end(ticket, finished(result, ticket.finish, ticket.live, ticket.on_steps, ticket.t_arrival))

    def _end(self, ticket: Ticket | EmbedTicket, outcome: Any) -> None:
        """The outcome (an Ended, an EmbedOutcome for an EmbedTicket) to its request, then to the
        engine's hook for it (the usage history)."""
        try:
            ticket.on_end(outcome)
            if self._on_step is not None:
                self._on_step()
        finally:
            if isinstance(ticket, EmbedTicket):
                if self._on_embedded is not None:
                    self._on_embedded(outcome)
            elif self._on_finish is not None:
                self._on_finish(ticket, outcome)


def _report(exc: BaseException) -> None:
    import sys
    import traceback

    detail = "".join(traceback.format_exception(exc)) if os.environ.get("LOCALINFER_DEBUG") else f"{type(exc).__name__}: {exc}\n"
    sys.stderr.write(f"localinfer serve: the engine failed; its running requests get an error: {detail}")


def _failed(ticket: Ticket, error: str | None, reason: str = "error") -> Ended:
    return failed(len(ticket.job.tokens), ticket.t_arrival, error, reason)
