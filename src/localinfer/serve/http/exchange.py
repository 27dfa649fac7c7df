"""One exchange, as every route has it: accept (the key; the body, within --max-body), parse (the
wire's parser: the whole body checked before any model is touched), pick the model (``multi.Served``,
whether it serves one pinned model or loads installed ones on demand), queue (prepared off the loop)
and write (``sending.AnswerResponse``, in the wire's shapes). Every protocol - OpenAI's, Anthropic's,
the Responses API, Ollama's - is a ``Wire`` run through :func:`answer`; no route asks which models
the server serves. ``ServerState`` is what the routes share.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from localinfer.serve.scheduler.bridge import Channel, Hub
from localinfer.serve.config import ServeConfig
from localinfer.serve.scheduler.worker import Overloaded
from localinfer.serve.http.metrics import Metrics
from localinfer.serve.wires.openai import ApiError, parse_body
from localinfer.serve.http.sending import AnswerResponse, call_checker, submit, unenforced

if TYPE_CHECKING:
    from localinfer.serve.scheduler.worker import Engine, Ended, Prepared, Ticket
    from localinfer.serve.models.multi import Picked, Served


@dataclass
class ServerState:
    """What the routes share: set up before serving; ``models`` answers which engine serves a request."""

    config: ServeConfig
    models: Served
    metrics: Metrics = field(default_factory=Metrics)
    hub: Hub | None = None
    created: int = 0
    say: Callable[[str], None] = field(default=lambda message: None, repr=False)  # serve's log (stderr)
    told: set[tuple[str, ...]] = field(default_factory=set, repr=False)  # tool keywords the log has named
    preparing: int = 0  # requests rendering or tokenizing without generating (``off_loop``)

    @classmethod
    def holding(cls, config: ServeConfig, names: tuple[str, ...], engine: Engine | None = None, *, key: str | None = None,
                n_ctx_seq: int | None = None, created: int = 0) -> ServerState:  # fmt: skip
        """A server of one model loaded elsewhere (``engine``; None: still loading), under ``names``."""
        from localinfer.serve.models.multi import Served

        return cls(config, Served.holding(config, names, engine, key=key, n_ctx_seq=n_ctx_seq), created=created)


@dataclass(frozen=True)
class Wire:
    """A protocol, as the one exchange sees it. ``parse``: a body to the wire's request (its
    ``model``: the name asked for, None: any), every field checked; ``error``: an ApiError as its
    error body; ``writer`` (the model picked, the request, what was prepared): its answer's writer
    (see ``AnswerResponse``); ``clamp``: max_tokens beyond what the prompt leaves of the context is
    lowered to it, not refused (llama-server's and Ollama's way: a client asks for 8k, 32k or 64k
    knowing no context; only a prompt that does not fit alone is refused); off for the resident
    server's wire, whose client is `run` and refuses as `run` does;
    ``fields``: the request's own load fields for ``Served.pick`` (Ollama's keep_alive, num_ctx);
    ``fit``: the request made for the model picked (what depends on its template), or an answer at
    once (a Response: nothing to generate)."""

    parse: Callable[[dict[str, Any]], Any]
    error: Callable[[ApiError], dict[str, Any]]
    writer: Callable[[Picked, Any, Any], Any]
    clamp: bool = True
    fields: Callable[[Any], dict[str, Any]] = lambda req: {}
    fit: Callable[[Any, Picked], Awaitable[Any]] | None = None


def state_of(request: Request) -> ServerState:
    return request.app.state.serve


def authorize(request: Request, state: ServerState) -> None:
    """``Authorization: Bearer KEY``, or Anthropic's ``x-api-key: KEY``, against ``--api-key``."""
    key = state.config.api_key
    if key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else request.headers.get("x-api-key", "")
    if not token or not hmac.compare_digest(token.encode(), key.encode()):
        raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'", type="authentication_error",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})  # fmt: skip


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) past ``limit`` bytes - by its Content-Length before reading it."""
    too_large = ApiError(413, f"the request body exceeds {limit} bytes (--max-body)", code="request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def body_of(request: Request, state: ServerState) -> dict[str, Any]:
    """Who asks (the key) and the body, read within --max-body and parsed as a JSON object."""
    authorize(request, state)
    return parse_body(await read_body(request, state.config.max_body))


async def accept(request: Request, state: ServerState, parse: Callable[[dict[str, Any]], Any]) -> Any:
    """The key, the body and the wire's request parsed from it (a schema's or grammar's checks: off the loop)."""
    body = await body_of(request, state)
    return await run_in_threadpool(parse, body)


async def pick(request: Request, state: ServerState, model: str | None, **fields: Any) -> Picked:
    """The one place a request's ``model`` chooses its engine (and its name in the answer)."""
    return await state.models.pick(request.scope, model, **fields)


async def answer(request: Request, wire: Wire) -> Response:
    """Every generating route: accept, parse, pick the model, prepare off the loop and queue, then
    stream or send the answer in the wire's shapes."""
    state = state_of(request)
    try:
        req = await accept(request, state, wire.parse)
        picked = await pick(request, state, req.model, **wire.fields(req))
        asked = req if wire.fit is None else await wire.fit(req, picked)
        if isinstance(asked, Response):
            return asked
        ticket, channel, mode, prepared = await queue(state, picked.engine, asked, clamp=wire.clamp)
    except Overloaded:
        return wire_error(wire, overloaded(state))
    except ApiError as exc:
        return wire_error(wire, exc)
    writer = wire.writer(picked, req, prepared)
    core = asked.request
    return AnswerResponse(ticket, channel, writer, mode, wire.error, unenforced(core), call_checker(core, state.say))


async def queue(state: ServerState, engine: Engine, req: Any, *, clamp: bool = False) -> tuple[Ticket, Channel[Ended], str, Any]:
    """Prepare a request off the loop and queue it: its ticket, the channel its answer comes by, how it
    streams (``submit``'s mode) and what was prepared. Every generating route's (``Overloaded``, ``ApiError``)."""
    _tell_unenforced(state, req.request)
    prepared = await run_in_threadpool(functools.partial(engine.prepare, req, clamp=clamp))  # serve's -n is the engine's (Engine.n_predict)
    assert state.hub is not None
    channel: Channel[Ended] = Channel(state.hub)
    ticket, mode = submit(engine, prepared, channel, req.stream, req.request.logprobs is not None)
    return ticket, channel, mode, prepared


async def prepared_only(request: Request, wire: Wire) -> tuple[Picked, Prepared]:
    """A request prepared as a generating one is (its prompt rendered, tokenized and checked: the
    prompt alone must fit), never queued: count_tokens, /apply-template, the input_tokens counts."""
    state = state_of(request)
    req = await accept(request, state, wire.parse)
    picked = await pick(request, state, req.model)
    return picked, await off_loop(state, functools.partial(picked.engine.prepare, req, clamp=True))


async def off_loop(state: ServerState, work: Callable[[], Any]) -> Any:
    """Work that renders or tokenizes without generating, in the thread pool, at most --max-queue at
    once (``Overloaded`` past it): nothing else bounds a client sending many at a time."""
    if state.preparing >= state.config.max_queue:
        raise Overloaded()
    state.preparing += 1
    try:
        return await run_in_threadpool(work)
    finally:
        state.preparing -= 1


def _tell_unenforced(state: ServerState, request: Any) -> None:
    """Said once per server for each set of tools (an agent resends its tools every turn)."""
    left = unenforced(request)
    if left and left not in state.told and len(state.told) < 256:
        state.told.add(left)
        state.say(f"tools: not enforced, described to the model only: {'; '.join(left)[:2000]}")


def wire_error(wire: Wire, exc: ApiError) -> JSONResponse:
    return JSONResponse(wire.error(exc), status_code=exc.status, headers=exc.headers)


def overloaded(state: ServerState) -> ApiError:
    return ApiError(503, f"too many requests are waiting ({state.config.max_queue}): retry shortly",
                    type="unavailable_error", code="server_overloaded", headers={"Retry-After": "1"})  # fmt: skip
