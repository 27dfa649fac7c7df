"""The HTTP routes: check who asks and what, hand the request to the engine, send its answer.

No model logic here: ``protocol`` validates, ``engine`` prepares and runs, ``responses`` shapes.
An answer is sent by ``AnswerResponse``, which also listens for the client going away: the request
is cancelled then, and its sequence is free at the engine's next step.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from dataclasses import dataclass, field
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from localinfer.serve.bridge import Channel, Hub
from localinfer.serve.config import ServeConfig
from localinfer.serve.engine import Overloaded, Ticket
from localinfer.serve.guard import Guard, allowed_names
from localinfer.serve.metrics import Gauges, Metrics
from localinfer.serve.protocol import ApiError, parse_body, parse_request
from localinfer.serve.responses import Answer, dumps

if TYPE_CHECKING:
    from localinfer.serve.engine import Engine, Outcome

ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/embeddings": "embeddings",
             "/v1/models": "models", "/health": "health", "/metrics": "metrics"}  # fmt: skip
STATUS_KEY = "localinfer.status"  # set in the scope by an answer whose status is not the one it sent (499)
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


@dataclass
class ServerState:
    """What the routes share: set up before serving; ``engine`` appears once the model is loaded."""

    config: ServeConfig
    names: tuple[str, ...]  # model names a request may ask for (the first is the canonical one)
    metrics: Metrics = field(default_factory=Metrics)
    engine: Engine | None = None
    hub: Hub | None = None
    created: int = 0

    def gauges(self) -> Gauges:
        e = self.engine
        if e is None:
            return Gauges()
        return Gauges(e.running, e.queued, e.cells_used, e.cells_total, True)


def create_app(state: ServerState) -> Starlette:
    from localinfer.serve import ollama

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        *ollama.routes(ollama.Shared(_authorize, _engine, _read_body, _overloaded, queue, AnswerResponse, serves)),
    ]
    handlers = {HTTPException: _http_error, ApiError: _api_error, Exception: _internal_error}
    config = state.config
    hosts = allowed_names(config.host, config.allowed_hosts)
    middleware = [Middleware(CountAnswers, metrics=state.metrics, endpoints={**ENDPOINTS, **ollama.ENDPOINTS}),
                  Middleware(Guard, hosts=hosts, origins=config.cors_origins, keyed=config.api_key is not None)]  # fmt: skip
    app = Starlette(routes=routes, exception_handlers=handlers, middleware=middleware)  # type: ignore[arg-type]
    app.state.serve = state
    return app


class CountAnswers:
    """Counts every answer by endpoint and status for /metrics: refusals, 500s and 499s included."""

    def __init__(self, app: Callable, *, metrics: Metrics, endpoints: dict[str, str] = ENDPOINTS) -> None:
        self.app, self.metrics, self.endpoints = app, metrics, endpoints  # path -> the name /metrics gives it

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        sent: list[int] = []

        async def send_counted(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                sent.append(message["status"])
            await send(message)

        unsent = 499  # cancelled before it answered
        try:
            await self.app(scope, receive, send_counted)
            unsent = 500  # returned without answering: uvicorn sends a 500
        except Exception:
            unsent = 500  # Starlette's last handler answers it
            raise
        finally:
            status = scope.get(STATUS_KEY) or (sent[0] if sent else unsent)
            self.metrics.answered(self.endpoints.get(scope.get("path", ""), "other"), status)


def _state(request: Request) -> ServerState:
    return request.app.state.serve


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = {404: "not_found_error", 405: "invalid_request_error"}.get(exc.status_code, "invalid_request_error")
    message = f"{request.method} {request.url.path}: {exc.detail}"
    if request.url.path.startswith("/api/"):  # Ollama's routes: its error shape
        return JSONResponse({"error": message}, status_code=exc.status_code)
    return error_response(ApiError(exc.status_code, message, type=kind, code=str(exc.detail).lower().replace(" ", "_")))


async def _internal_error(request: Request, exc: Exception) -> Response:
    return error_response(ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error", code="internal_error"))


def _authorize(request: Request, state: ServerState) -> None:
    key = state.config.api_key
    if key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'", type="authentication_error",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})  # fmt: skip


def _engine(state: ServerState) -> Engine:
    if state.engine is None:
        raise ApiError(503, "the model is loading", type="unavailable_error", code="model_loading", headers={"Retry-After": "1"})
    return state.engine


# -- routes ---------------------------------------------------------------------------------------
async def health(request: Request) -> Response:
    """503 while the model loads, 200 once requests can be answered (no key needed: for probes)."""
    state = _state(request)
    if state.engine is None:
        return error_response(ApiError(503, "the model is loading", type="unavailable_error", code="model_loading"))
    return JSONResponse({"status": "ok"})


async def metrics(request: Request) -> Response:
    state = _state(request)
    _authorize(request, state)
    return PlainTextResponse(state.metrics.render(state.gauges()), media_type="text/plain; version=0.0.4")


async def models(request: Request) -> Response:
    state = _state(request)
    _authorize(request, state)
    engine = state.engine
    meta = {"n_ctx_seq": engine.n_ctx_seq, "parallel": engine.parallel} if engine else {"loading": True}
    data = [{"id": state.names[0], "object": "model", "created": state.created, "owned_by": "localinfer", "meta": meta}]
    return JSONResponse({"object": "list", "data": data})


async def chat_completions(request: Request) -> Response:
    return await _complete(request, "chat")


async def completions(request: Request) -> Response:
    return await _complete(request, "text")


async def _complete(request: Request, kind: str) -> Response:
    state = _state(request)
    try:
        _authorize(request, state)
        engine = _engine(state)
        req = parse_request(parse_body(await _read_body(request, state.config.max_body)), kind)
        if not serves(state.names, req.model):
            raise ApiError(404, f"model '{req.model}' not found: this server serves {', '.join(state.names)}",
                           code="model_not_found", param="model")  # fmt: skip
        ticket, channel, mode = await queue(state, engine, req)
    except Overloaded:
        return error_response(_overloaded(state))
    except ApiError as exc:
        return error_response(exc)
    answer = Answer.new(kind, state.names[0], req.include_usage)
    return AnswerResponse(ticket, channel, answer, mode)  # type: ignore[return-value]


async def queue(state: ServerState, engine: Engine, req: Any) -> tuple[Ticket, Channel[Outcome], str]:
    """Prepare a request off the loop and queue it: its ticket, the channel its answer comes by, and
    how it streams (``submit``'s mode). Every generating route's (``Overloaded``, ``ApiError``)."""
    with engine.arriving():
        prepared = await run_in_threadpool(engine.prepare, req)
        assert state.hub is not None
        channel: Channel[Outcome] = Channel(state.hub)
        ticket, mode = submit(engine, prepared, channel, req.stream, req.logprobs is not None)
    return ticket, channel, mode


def submit(engine: Engine, prepared: Any, channel: Channel[Outcome], stream: bool, logprobs: bool = False) -> tuple[Ticket, str]:
    """Queue a prepared request whose answer goes to ``channel``, and how it streams: ``whole`` (the
    outcome only), ``text`` (raw pieces: an answer that is all text), ``logprobs`` (pieces with their
    entries; calls are not parsed from them) or ``steps`` (``localinfer.finish``'s). Every protocol's route."""
    from localinfer.finish import plain

    if not stream:
        return engine.submit(prepared, None, channel.close), "whole"
    if plain(None, prepared.tools) and logprobs:  # thinking stays inline in a stream of logprobs
        return engine.submit(prepared, None, channel.close, on_logprobs=channel.push_logprobs), "logprobs"
    if plain(prepared.splitter, prepared.tools):
        return engine.submit(prepared, channel.push, channel.close), "text"
    return engine.submit(prepared, None, channel.close, on_steps=channel.push_steps), "steps"


async def embeddings(request: Request) -> Response:
    from localinfer.serve import embeddings as emb

    state = _state(request)
    try:
        _authorize(request, state)
        engine = _engine(state)
        req = emb.parse(parse_body(await _read_body(request, state.config.max_body)))
        if not serves(state.names, req.model):
            raise ApiError(404, f"model '{req.model}' not found: this server serves {', '.join(state.names)}",
                           code="model_not_found", param="model")  # fmt: skip
        tokens = await run_in_threadpool(emb.tokenize, engine, req)
        outcome = await emb.run(engine, tokens)
    except Overloaded:
        return error_response(_overloaded(state))
    except ApiError as exc:
        return error_response(exc)
    if outcome.error is not None:
        return error_response(ApiError(500, f"the embedding failed: {outcome.error}", type="server_error", code="engine_error"))
    return Response(dumps(emb.response(state.names[0], req, outcome)), media_type="application/json")


def _overloaded(state: ServerState) -> ApiError:
    return ApiError(503, f"too many requests are waiting ({state.config.max_queue}): retry shortly",
                    type="unavailable_error", code="server_overloaded", headers={"Retry-After": "1"})  # fmt: skip


def serves(names: tuple[str, ...], model: str | None) -> bool:
    """Whether a request for ``model`` is ours: our names, and any name that is not a GGUF file's -
    clients hard-code names (``gpt-4o``) and one model answers them, as llama-server does; a request
    for another .gguf file asks for a model we do not have."""
    return model is None or model in names or not model.lower().endswith(".gguf")


async def _read_body(request: Request, limit: int) -> bytes:
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


class AnswerResponse:
    """Sends one engine answer - SSE events (or NDJSON lines) as the text comes, or one JSON body at the
    end - while watching for the client to go away (then the request is cancelled: its sequence frees at once).

    ``writer`` makes the protocol's bytes: ``head(mode)`` (the stream's first events), ``text_piece``
    (a piece of text already a JSON string: the fast path), ``steps``, ``logprobs_piece``,
    ``tail(outcome)``, ``stream_error(exc)`` and ``whole(outcome)`` (a JSON object), and may name its
    stream's ``stream_headers`` (SSE's by default); ``error``: the protocol's error body."""

    def __init__(self, ticket: Ticket, channel: Channel[Outcome], writer: Any, mode: str,
                 error: Callable[[ApiError], dict[str, Any]] = ApiError.body) -> None:  # fmt: skip
        self.ticket, self.channel, self.writer, self.mode, self.error = ticket, channel, writer, mode, error  # mode: app.submit's
        self.stream = mode != "whole"
        self.gone = False
        self.ended = False  # the engine's outcome arrived

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        watcher = asyncio.ensure_future(self._watch(receive))
        status = 499  # nginx's "client closed request": also what a cancelled task counts as
        try:
            status = await (self._send_stream(send) if self.stream else self._send_whole(send))
        finally:
            watcher.cancel()
            if not self.ended:
                self.ticket.cancel()
            scope[STATUS_KEY] = status  # CountAnswers counts this one (499 after a 200 went out)

    async def _watch(self, receive: Callable) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        self.ticket.cancel()
        self.channel.wake()

    async def _send_stream(self, send: Callable) -> int:
        writer = self.writer
        await send({"type": "http.response.start", "status": 200, "headers": getattr(writer, "stream_headers", SSE_HEADERS)})
        head = writer.head(self.mode)
        if head:
            await send({"type": "http.response.body", "body": head, "more_body": True})
        offset = 0  # characters sent: the completions API's text_offset
        while True:
            if self.mode == "text":  # the fast path: each piece spliced into a chunk made once
                text, end = await self.channel.get()
                body = writer.text_piece(encode_basestring(text).encode()) if text else b""
            elif self.mode == "steps":
                steps, end = await self.channel.get_steps()
                body = writer.steps(steps)
            else:
                text, entries, end = await self.channel.get_logprobs()
                body = writer.logprobs_piece(text, entries, offset)
                offset += len(text)
            if self.gone:
                return 499
            if end is not None:
                self.ended = True
                failed = end.error is not None or end.finish_reason == "interrupted"
                body += writer.stream_error(_outcome_error(end)) if failed else writer.tail(end)
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return 200
            if body:
                await send({"type": "http.response.body", "body": body, "more_body": True})

    async def _send_whole(self, send: Callable) -> int:
        end = None
        while end is None:
            _, end = await self.channel.get()
            if self.gone:
                return 499
        self.ended = True
        if end.error is not None or end.finish_reason == "interrupted":
            exc = _outcome_error(end)
            await JSONResponse(self.error(exc), status_code=exc.status, headers=exc.headers)({"type": "http"}, _no_receive, send)
            return exc.status
        body = dumps(self.writer.whole(end)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return 200


def _outcome_error(end: Outcome) -> ApiError:
    if end.finish_reason == "interrupted":
        return ApiError(503, "the request was cancelled: the server is shutting down", type="unavailable_error", code="cancelled")
    return ApiError(500, end.error or "the engine failed", type="server_error", code="engine_error")


async def _no_receive() -> dict[str, Any]:  # pragma: no cover - a JSONResponse never reads
    return {"type": "http.disconnect"}
