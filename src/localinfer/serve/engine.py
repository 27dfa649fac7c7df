"""The server's engine: one thread owns the model and runs every request through one BatchDecoder.

Requests come in through a thread-safe queue (``submit``); a request arriving while others decode
joins them at the next step, in the slot whose KV cache shares the longest prefix with its prompt
(the next turn of a chat evaluates only its new tokens). Text goes out through each request's
``on_text`` as it is sampled, and its ``Outcome`` through ``on_end``; both are called on the engine
thread, so they must be quick (``bridge`` hands them to the event loop). Cancelling a request frees
its sequence at the next step.

Embedding requests (``submit_embed``) run on the same thread, in an embedding context beside the
generation one (made on first use), just before the next decoding step - or at once when nothing
decodes (a marker in the queue wakes the thread): llama.cpp never runs two decodes at once on our
model, and an embedding needs no sequence, so it waits for none to free up.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.engine.types import GenerationStats
from localinfer.errors import ContextOverflowError, UsageError
from localinfer.serve.protocol import ApiError, CompletionRequest

if TYPE_CHECKING:
    from localinfer.engine.batch import BatchDecoder, SeqJob, SeqResult
    from localinfer.engine.embed import Embedder
    from localinfer.finish import Finish, Step
    from localinfer.generate import LoadedModel
    from localinfer.reasoning import Splitter
    from localinfer.toolcalls.plan import ToolPlan
    from localinfer.toolcalls.spec import ToolCall


@dataclass(frozen=True)
class Prepared:
    """A request turned into what the decoder runs: prompt tokens and every stop string."""

    request: CompletionRequest
    tokens: list[int]
    stop: tuple[str, ...]
    splitter: Splitter | None = None  # a reasoning model's thinking, apart from the answer
    tools: ToolPlan | None = None  # how the answer's tool calls are parsed (and constrained)


@dataclass(frozen=True)
class Outcome:
    """How a request ended. Times in seconds from its arrival (``submit``); ``finish_reason``:
    stop | length | interrupted (cancelled) | error (then ``error`` says why)."""

    text: str
    finish_reason: str | None
    stats: GenerationStats
    queue_s: float  # waiting for a slot
    ttft_s: float | None  # to the first token sampled (of the answer, after any thinking)
    total_s: float
    error: str | None = None
    reasoning: str | None = None  # the thinking, split from ``text`` (None: not a reasoning answer)
    reasoning_tokens: int | None = None
    reasoning_ttft_s: float | None = None  # to the first piece of thinking
    tool_calls: tuple[ToolCall, ...] = ()  # the calls parsed out of the answer (``text`` is the rest)

    @property
    def reason(self) -> str | None:
        """The answer's finish reason (``tool_calls`` when it ended by itself with calls);
        ``finish_reason`` is the engine's (what /metrics counts)."""
        from localinfer.toolcalls.plan import finish_reason

        return finish_reason(self.tool_calls, self.finish_reason)


@dataclass(frozen=True)
class EmbedOutcome:
    """An embedding request's vectors (in input order) and tokens, or its ``error``."""

    vectors: list[list[float]]
    tokens: int
    queue_s: float
    total_s: float
    error: str | None = None


class EmbedTicket:
    """An embedding request in the queue: token lists in, ``on_end(EmbedOutcome)`` out."""

    __slots__ = ("inputs", "on_end", "t_arrival", "cancelled")

    def __init__(self, inputs: list[list[int]], on_end: Callable[[EmbedOutcome], None]) -> None:
        self.inputs, self.on_end = inputs, on_end
        self.t_arrival = time.perf_counter()
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()


_WAKE = object()  # in the queue: embedding requests are waiting (``Engine._embeds``)
GATHER_S = 0.002  # an idle engine's first step waits this long for the next request of a burst...
GATHER_MAX_S = 0.05  # ...and at most this long in all, while requests are still being prepared


class Overloaded(Exception):
    """The queue of requests waiting for a slot is full."""


class Ticket:
    """One submitted request, as its owner holds it: ``cancel()`` may be called from any thread."""

    __slots__ = ("key", "job", "t_arrival", "on_end", "cancelled", "prepared", "finish", "live", "on_steps")

    def __init__(self, key: int, job: SeqJob, prepared: Prepared, on_end: Callable[[Outcome], None], finish: Finish,
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
        on_finish: Callable[[Ticket, Outcome], None] | None = None, on_step: Callable[[], None] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        embed_ctx: int = 512, on_embedded: Callable[[EmbedOutcome], None] | None = None,
    ) -> None:  # fmt: skip
        """``on_step``: called on the engine thread just before each ``llama_decode`` and after each
        request ends - where its callbacks' news may be handed on (``bridge.Hub.flush``).
        ``embed_ctx``: the embedding context's tokens per decode (the longest input); ``on_embedded``:
        called on the engine thread after each embedding request (the usage history)."""
        self.loaded = loaded
        self.parallel = parallel
        self.max_queue = max_queue
        self.template_kwargs = template_kwargs or {}  # --chat-template-kwargs: a request's own win, key by key
        self.n_ctx_seq = loaded.model.n_ctx_seq
        self._on_finish = on_finish
        self._on_step = on_step
        self.embed_ctx = embed_ctx
        self._on_embedded = on_embedded
        self._embedder: Embedder | None = None  # made by the engine thread on first use
        self._queue: queue.Queue[Ticket | object | None] = queue.Queue()
        self._embeds: collections.deque[EmbedTicket] = collections.deque()
        self._running: dict[int, Ticket] = {}
        self._keys = itertools.count()
        self._decoder: BatchDecoder | None = None
        self._arriving = 0  # requests being prepared (read by the engine thread)
        self._thread = threading.Thread(target=self._loop, name="localinfer-engine", daemon=True)

    # -- what the HTTP side calls --------------------------------------------------------------------
    def prepare(self, request: CompletionRequest) -> Prepared:
        """Render and tokenize the prompt and compile the format (any thread: the template, the
        tokenizer and the compiler are thread-safe); a prompt that does not fit one sequence's context
        with ``max_tokens``, or a format that does not compile, is a 400."""
        prepared = self._prepare(request)
        self._compiled(request)
        return prepared

    def _prepare(self, request: CompletionRequest) -> Prepared:
        from localinfer import request as rq
        from localinfer.engine.templates import TemplateRefusedError
        from localinfer.generate import build_prompt, reasoning_splitter, tool_plan

        model = self.loaded.model
        if isinstance(request.prompt, tuple):
            bad = next((t for t in request.prompt if t >= model.n_vocab), None)
            if bad is not None:
                raise ApiError(400, f"token id {bad} is out of the vocabulary ({model.n_vocab} tokens)", param="prompt")
            return self._checked(Prepared(request, list(request.prompt), ()))
        if request.kind == "chat" and self.loaded.template is None:
            raise ApiError(400, f"{self.loaded.name} has no chat template: use /v1/completions", code="no_chat_template")
        try:
            chat = request.kind == "chat"  # max_tokens: checked below
            req = rq.build(None if chat else request.prompt, messages=request.messages if chat else None, raw=not chat,
                           chat_template_kwargs={**self.template_kwargs, **(request.chat_template_kwargs or {})},
                           reasoning_format=request.reasoning_format, tools=request.tools,
                           tool_choice=request.tool_choice, parallel_tool_calls=request.parallel_tool_calls)  # fmt: skip
            tokens, stops, _ = build_prompt(self.loaded, req, n_ctx=self.n_ctx_seq)
        except ContextOverflowError as exc:
            raise ApiError(400, f"{exc}; it must fit one sequence's context (--ctx-size)", code="context_length_exceeded") from None
        except (UsageError, TemplateRefusedError) as exc:
            raise ApiError(400, f"the chat template refused these messages: {exc}", code="template_error") from None
        return self._checked(Prepared(request, tokens, stops, reasoning_splitter(self.loaded, req, tokens), tool_plan(self.loaded, req)))

    def _compiled(self, request: CompletionRequest) -> None:
        """Compile the request's format here, off the engine thread (the engine finds it in the model's
        cache): a grammar or schema that does not compile is a 400 before the request is queued."""
        if request.response_format is None:
            return
        from localinfer.engine.constrain import compile_for
        from localinfer.structured import FormatError

        try:
            compile_for(self.loaded.model, request.response_format)
        except FormatError as exc:
            raise ApiError(400, f"'{request.format_field}' cannot be enforced: {exc}", param=request.format_field,
                           code="invalid_schema") from None  # fmt: skip

    def _checked(self, p: Prepared) -> Prepared:
        """Refused, not capped: a client asking for more tokens than fit learns it now (as OpenAI's API)."""
        n, wanted = len(p.tokens), p.request.max_tokens
        if n + (wanted or 1) > self.n_ctx_seq:
            what = f"the prompt ({n} tokens)" + (f" and max_tokens ({wanted})" if wanted else "")
            raise ApiError(400, f"{what} exceed the context of a sequence ({self.n_ctx_seq} tokens)", code="context_length_exceeded")
        return p

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        """Around preparing and submitting a request: the engine, idle, waits for it to start with
        the others of its burst (see ``_source``). Event loop thread only."""
        self._arriving += 1
        try:
            yield
        finally:
            self._arriving -= 1

    def submit(
        self, prepared: Prepared, on_text: Callable[[str], None] | None, on_end: Callable[[Outcome], None],
        on_logprobs: Callable[[str, list], None] | None = None,
        on_steps: Callable[[list[Step]], None] | None = None,
    ) -> Ticket:  # fmt: skip
        """Queue a request. Its answer streams as raw text pieces (``on_text``: the fast path of an
        answer that is all text), as pieces with their logprobs (``on_logprobs``: thinking stays
        inline), or as typed steps (``on_steps``: thinking, text, tool calls - ``localinfer.finish``);
        all None: wanted only at the end. ``Overloaded`` when more than ``max_queue`` would wait."""
        from localinfer.engine.batch import SeqJob
        from localinfer.finish import Finish

        if self._waiting_chats() - (self.parallel - self.running) >= self.max_queue:
            raise Overloaded()
        r = prepared.request
        from localinfer.generate import constraint_for

        finish = Finish(prepared.splitter if on_logprobs is None else None, prepared.tools)
        live = on_steps is not None or finish.splits  # thinking is counted piece by piece
        constraint, after = constraint_for(prepared.tools, r.response_format, prepared.splitter)
        job = SeqJob(
            next(self._keys), prepared.tokens, r.sampling, r.max_tokens, tuple(dict.fromkeys((*r.stop, *prepared.stop))),
            r.ignore_eos, on_text=_feeder(finish, on_text, on_steps) if live else on_text, cancel=threading.Event(),
            cache_prompt=r.cache_prompt, constraint=constraint, constraint_after=after, logprobs=r.logprobs,
            on_logprobs=on_logprobs,
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
                with BatchDecoder(self.loaded.model, self.parallel, keep_cache=True) as decoder:
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

        A burst that finds the engine idle is gathered into its first step: requests reach the queue
        one by one (each is parsed and tokenized first), and one that misses the step waits for all
        of it (a whole prefill) - llama-server, whose HTTP threads need no GIL, rarely misses it.
        """
        gather_end, step = 0.0, -1  # while gathering a burst: the latest its first step may start
        while True:
            try:
                if decoder.n_active == 0:
                    ticket = self._queue.get()
                    gather_end, step = time.perf_counter() + GATHER_MAX_S, decoder.stats.steps
                elif gather_end and decoder.stats.steps == step:  # the first step has not started yet
                    ticket = self._gathered(gather_end)
                else:
                    ticket = self._queue.get_nowait()
            except queue.Empty:
                gather_end = 0.0
                yield None
                continue
            if ticket is None:
                self._run_embeds()  # cancelled by stop(): answered, not left waiting
                return
            if ticket is _WAKE:
                self._run_embeds()
                continue
            if ticket.cancelled is not None and ticket.cancelled.is_set():
                self._end(ticket, _failed(ticket, None, "interrupted"))
                continue
            self._running[ticket.key] = ticket
            yield ticket.job

    def _gathered(self, until: float) -> Ticket | None:
        """The next request of a burst: waits ``GATHER_S`` for it, and again while requests are still
        being prepared (``arriving``), until ``until``; ``queue.Empty`` when the burst is over."""
        while (left := until - time.perf_counter()) > 0:
            try:
                return self._queue.get(timeout=min(left, GATHER_S))
            except queue.Empty:
                if not self._arriving:
                    raise
        raise queue.Empty

    def _before_decode(self) -> None:
        if self._embeds:
            self._run_embeds()
        if self._on_step is not None:
            self._on_step()

    def _run_embeds(self) -> None:
        """Run the waiting embedding requests now, between two decoding steps (engine thread)."""
        while self._embeds:
            self._embed(self._embeds.popleft())

    def _embed(self, ticket: EmbedTicket) -> None:
        from localinfer.engine.embed import Embedder

        t0 = time.perf_counter()
        vectors: list[list[float]] = []
        error = "the request was cancelled" if ticket.cancelled.is_set() else None
        if error is None:
            try:
                if self._embedder is None:
                    self._embedder = Embedder(self.loaded.model, n_ctx=self.embed_ctx)
                vectors = self._embedder.embed(ticket.inputs)
            except Exception as exc:  # noqa: BLE001 - the request fails, the engine goes on
                error = f"{type(exc).__name__}: {exc}"
        now = time.perf_counter()
        self._end(ticket, EmbedOutcome(vectors, sum(map(len, ticket.inputs)), t0 - ticket.t_arrival, now - ticket.t_arrival, error))

    def _finish(self, result: SeqResult) -> None:
        ticket = self._running.pop(result.key)
        if result.error is not None:
            self._end(ticket, _failed(ticket, result.error))
            return
        from localinfer.finish import since

        st = result.stats
        ttft = None if st.first_token_s is None else result.t_admit + st.first_token_s - ticket.t_arrival
        reason = st.finish_reason
        if reason == "stop" and st.document == "incomplete":  # a stop string inside the document cut it
            reason = "length"  # never "stop" for a document that does not parse (clients trust it)
        finish, t0 = ticket.finish, ticket.t_arrival
        if not ticket.live:
            finish.feed(result.text)
        tail = finish.close()
        if tail and ticket.on_steps is not None:
            ticket.on_steps(tail)  # what was held back (a marker's start, a call's end), before the outcome
        done = finish.result(reason, st)
        outcome = Outcome(
            done.text, reason, st, queue_s=result.t_admit - t0, ttft_s=since(done.t_text, t0) if finish.splits else ttft,
            total_s=result.t_end - t0, reasoning=done.reasoning, reasoning_tokens=done.reasoning_tokens,
            reasoning_ttft_s=since(done.t_reasoning, t0), tool_calls=done.tool_calls,
        )  # fmt: skip
        self._end(ticket, outcome)

    def _end(self, ticket: Ticket | EmbedTicket, outcome: Any) -> None:
        """The outcome (an Outcome, an EmbedOutcome for an EmbedTicket) to its request, then to the
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


def _feeder(finish: Finish, on_text: Callable[[str], None] | None,
            on_steps: Callable[[list[Step]], None] | None) -> Callable[[str], None]:  # fmt: skip
    """The decoder's ``on_text`` for an answer finished piece by piece: its steps to ``on_steps``, else
    its answer text to ``on_text`` (either may be None: wanted at the end only)."""
    from localinfer.finish import Text

    def feed(piece: str) -> None:
        steps = finish.feed(piece)
        if not steps:
            return
        if on_steps is not None:
            on_steps(steps)
        elif on_text is not None:
            for step in steps:
                if isinstance(step, Text):
                    on_text(step.text)

    return feed


def _report(exc: BaseException) -> None:
    import sys
    import traceback

    detail = "".join(traceback.format_exception(exc)) if os.environ.get("LOCALINFER_DEBUG") else f"{type(exc).__name__}: {exc}\n"
    sys.stderr.write(f"localinfer serve: the engine failed; its running requests get an error: {detail}")


def _failed(ticket: Ticket, error: str | None, reason: str = "error") -> Outcome:
    waited = time.perf_counter() - ticket.t_arrival
    stats = GenerationStats(prompt_tokens=len(ticket.job.tokens), finish_reason=reason)
    return Outcome("", reason, stats, queue_s=waited, ttft_s=None, total_s=waited, error=error)
