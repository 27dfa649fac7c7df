"""The HTTP routes: check who asks and what, hand the request to the engine, send its answer.

No model logic here: ``engine`` prepares and runs, ``localinfer.generate.finish`` finishes the answer, and each
wire protocol is a translator (a ``Wire``: its parser, its error shape, its answer writer): OpenAI's
Chat Completions (``protocol``, ``responses``), Anthropic's Messages (``anthropic``) and OpenAI's
Responses (``responses_api``) share one path (``answer``): limits, auth, queueing, metrics. An answer
is sent by ``AnswerResponse``, which also listens for the client going away: the request is cancelled
then, and its sequence is free at the engine's next step.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Callable
from dataclasses import dataclass, field
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
from localinfer.serve.engine import Overloaded
from localinfer.serve.guard import Guard, allowed_names, error_body
from localinfer.serve.metrics import Gauges, Metrics
from localinfer.serve.prepare import default_cap
from localinfer.serve.protocol import ApiError, parse_body, parse_request
from localinfer.serve.responses import CompletionWriter, dumps
from localinfer.serve.sending import STATUS_KEY, AnswerResponse, call_checker, submit, unenforced

if TYPE_CHECKING:
    from localinfer.serve.engine import Engine, Ended, Prepared, Ticket
    from localinfer.serve.multi import Served

ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/embeddings": "embeddings",
             "/v1/models": "models", "/health": "health", "/metrics": "metrics", **{
             "/v1/messages": "messages", "/v1/messages/count_tokens": "count_tokens", "/v1/responses": "responses"}}  # fmt: skip


@dataclass
class ServerState:
    """What the routes share: set up before serving; ``engine`` appears once the model is loaded."""

    config: ServeConfig
    names: tuple[str, ...]  # model names a request may ask for (the first is the canonical one)
    metrics: Metrics = field(default_factory=Metrics)
    engine: Engine | None = None
    hub: Hub | None = None
    created: int = 0
    router: Served | None = None  # multi.Served: every installed model, on demand (``engine`` stays None)
    say: Callable[[str], None] = field(default=lambda message: None, repr=False)  # serve's log (stderr)
    told: set[tuple[str, ...]] = field(default_factory=set, repr=False)  # tool keywords the log has named
    preparing: int = 0  # requests rendering or tokenizing without generating (``off_loop``)

    def gauges(self) -> Gauges:
        if self.router is not None:
            return self.router.gauges()
        return Gauges() if self.engine is None else Gauges.of([self.engine])


def create_app(state: ServerState) -> Starlette:
    from localinfer.request import checker
    from localinfer.serve import llama_routes, ollama
    from localinfer.serve.multi import Leases

    checker.enable()  # large schemas and grammars are checked in a helper process, off the loop's GIL

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        *protocol_routes(),
        *llama_routes.routes(llama_routes.Shared(_authorize, _engine, _pick, _read_body, _overloaded, prepared_only,
                                                 off_loop, CHAT, Wire)),
        *ollama.routes(ollama.Shared(_authorize, _engine, _read_body, _overloaded, queue, AnswerResponse, serves)),
    ]
    handlers = {HTTPException: _http_error, ApiError: _api_error, Exception: _internal_error}
    config = state.config
    hosts = allowed_names(config.host, config.allowed_hosts)
    middleware = [Middleware(CountAnswers, metrics=state.metrics, endpoints={**ENDPOINTS, **llama_routes.ENDPOINTS, **ollama.ENDPOINTS}),
                  Middleware(Guard, hosts=hosts, origins=config.cors_origins, keyed=config.api_key is not None),
                  Middleware(Leases)]  # fmt: skip
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
    error = ApiError(exc.status_code, message, type=kind, code=str(exc.detail).lower().replace(" ", "_"))
    return JSONResponse(error_body(request.url.path, error), status_code=error.status)


async def _internal_error(request: Request, exc: Exception) -> Response:
    error = ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error", code="internal_error")
    return JSONResponse(error_body(request.url.path, error), status_code=error.status)


def _authorize(request: Request, state: ServerState) -> None:
    """``Authorization: Bearer KEY``, or Anthropic's ``x-api-key: KEY``, against ``--api-key``."""
    key = state.config.api_key
    if key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else request.headers.get("x-api-key", "")
    if not token or not hmac.compare_digest(token.encode(), key.encode()):
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
    if state.engine is None and state.router is None:
        return error_response(ApiError(503, "the model is loading", type="unavailable_error", code="model_loading"))
    return JSONResponse({"status": "ok"})


async def metrics(request: Request) -> Response:
    state = _state(request)
    _authorize(request, state)
    text = state.metrics.render(state.gauges(), state.router.metrics_text if state.router is not None else None)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def models(request: Request) -> Response:
    state = _state(request)
    _authorize(request, state)
    if state.router is not None:
        return JSONResponse(await run_in_threadpool(state.router.openai_models, state.created))
    engine = state.engine
    meta = {"n_ctx_seq": engine.n_ctx_seq, "parallel": engine.parallel, "vision": engine.vision} if engine else {"loading": True}
    data = [{"id": state.names[0], "object": "model", "created": state.created, "owned_by": "localinfer", "meta": meta}]
    return JSONResponse({"object": "list", "data": data})


@dataclass(frozen=True)
class Wire:
    """A protocol, as the shared path sees it: ``parse`` (a body to serve's request), ``error`` (an
    ApiError to its error body), ``writer`` (model name, request, prepared: its answer's writer: see
    ``AnswerResponse``); ``clamp``: max_tokens beyond the context is lowered, not refused."""

    parse: Callable[[dict[str, Any]], Any]
    error: Callable[[ApiError], dict[str, Any]]
    writer: Callable[[str, Any, Any], Any]
    clamp: bool = False


def _chat_wire(kind: str, whole: bool = False) -> Wire:
    return Wire(functools.partial(parse_request, kind=kind), functools.partial(ApiError.body, whole=whole),
                lambda model, req, prepared: CompletionWriter.new(kind, model, req.include_usage, whole, req.return_progress))  # fmt: skip


CHAT, COMPLETIONS = _chat_wire("chat"), _chat_wire("text")
# The resident server's (ServeConfig.whole_answers): answers and errors also carry what our CLI reads
WHOLE = {"chat": _chat_wire("chat", True), "text": _chat_wire("text", True)}


def protocol_routes() -> list[Route]:
    """The routes of the protocols beside OpenAI's Chat Completions (one place to add one)."""
    return [
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
    ]


async def chat_completions(request: Request) -> Response:
    return await answer(request, WHOLE["chat"] if _state(request).config.whole_answers else CHAT)


async def completions(request: Request) -> Response:
    return await answer(request, WHOLE["text"] if _state(request).config.whole_answers else COMPLETIONS)


async def messages(request: Request) -> Response:
    from localinfer.serve import anthropic

    wire = Wire(anthropic.parse, anthropic.error_body, lambda model, req, p: anthropic.AnthropicWriter(model, len(p.tokens), req.request.stop), clamp=True)
    return await answer(request, wire)


async def count_tokens(request: Request) -> Response:
    """Anthropic's count_tokens: the prompt's tokens, as the request's usage.input_tokens counts them."""
    from localinfer.serve import anthropic

    wire = Wire(functools.partial(anthropic.parse, counting=True), anthropic.error_body, lambda *_: None, clamp=True)
    try:
        _, _, prepared = await prepared_only(request, wire)
    except Overloaded:
        return _wire_error(wire, _overloaded(_state(request)))
    except ApiError as exc:
        return _wire_error(wire, exc)
    return JSONResponse({"input_tokens": len(prepared.tokens)})


async def prepared_only(request: Request, wire: Wire) -> tuple[Engine, str, Prepared]:
    """A request prepared as a generating one is (its prompt rendered, tokenized and checked: the
    prompt alone must fit), never queued: count_tokens, /apply-template, the input_tokens counts."""
    state = _state(request)
    engine, req, name = await _accept(request, state, wire)
    return engine, name, await off_loop(state, functools.partial(engine.prepare, req, clamp=True))


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


async def responses(request: Request) -> Response:
    from localinfer.serve import responses_api as ra

    return await answer(request, Wire(ra.parse, ra.error_body, lambda model, req, p: ra.ResponsesWriter(model, req.request)))


async def queue(state: ServerState, engine: Engine, req: Any, *, clamp: bool = False) -> tuple[Ticket, Channel[Ended], str, Any]:
    """Prepare a request off the loop and queue it: its ticket, the channel its answer comes by, how it
    streams (``submit``'s mode) and what was prepared. Every generating route's (``Overloaded``, ``ApiError``)."""
    _tell_unenforced(state, req.request)
    with engine.arriving():
        prepare = functools.partial(engine.prepare, req, clamp=True) if clamp else functools.partial(engine.prepare, req)
        prepared = default_cap(await run_in_threadpool(prepare), state.config.n_predict, engine.n_ctx_seq)
        assert state.hub is not None
        channel: Channel[Ended] = Channel(state.hub)
        ticket, mode = submit(engine, prepared, channel, req.stream, req.request.logprobs is not None)
    return ticket, channel, mode, prepared


def _tell_unenforced(state: ServerState, request: Any) -> None:
    """Said once per server for each set of tools (an agent resends its tools every turn)."""
    left = unenforced(request)
    if left and left not in state.told and len(state.told) < 256:
        state.told.add(left)
        state.say(f"tools: not enforced, described to the model only: {'; '.join(left)[:2000]}")


def _wire_error(wire: Wire, exc: ApiError) -> JSONResponse:
    return JSONResponse(wire.error(exc), status_code=exc.status, headers=exc.headers)


async def _accept(request: Request, state: ServerState, wire: Wire) -> tuple[Engine, Any, str]:
    """Who asks (the key), whether we can answer (loaded), and what (the body, parsed; the model
    ours): the engine, the request and the model's name."""
    _authorize(request, state)
    if state.router is None:
        _engine(state)
    body = parse_body(await _read_body(request, state.config.max_body))
    req = await run_in_threadpool(wire.parse, body)  # a schema's or grammar's checks: off the loop
    engine, name = await _pick(request, state, req.model)
    return engine, req, name


async def _pick(request: Request, state: ServerState, model: str | None) -> tuple[Engine, str]:
    """The one place a request's ``model`` chooses its engine (and its name in the answer)."""
    if state.router is not None:
        return await state.router.engine_for(request.scope, model)
    _ours(state, model)
    return _engine(state), state.names[0]


def _ours(state: ServerState, model: str | None) -> None:
    if not serves(state.names, model):
        raise ApiError(404, f"model '{model}' not found: this server serves {', '.join(state.names)}",
                       code="model_not_found", param="model")  # fmt: skip


async def answer(request: Request, wire: Wire) -> Response:
    """Every generating route: accept, prepare off the loop, queue, then stream or send the answer."""
    state = _state(request)
    try:
        engine, req, name = await _accept(request, state, wire)
        ticket, channel, mode, prepared = await queue(state, engine, req, clamp=wire.clamp)
    except Overloaded:
        return _wire_error(wire, _overloaded(state))
    except ApiError as exc:
        return _wire_error(wire, exc)
    writer = wire.writer(name, req, prepared)
    return AnswerResponse(ticket, channel, writer, mode, wire.error, unenforced(req.request), call_checker(req.request, state.say))


async def embeddings(request: Request) -> Response:
    from localinfer.serve import embeddings as emb

    state = _state(request)
    try:
        _authorize(request, state)
        if state.router is None:
            _engine(state)
        req = emb.parse(parse_body(await _read_body(request, state.config.max_body)))
        engine, name = await _pick(request, state, req.model)
        tokens = await run_in_threadpool(emb.tokenize, engine, req)
        outcome = await emb.run(engine, tokens, request.receive)  # a disconnect cancels it
    except Overloaded:
        return error_response(_overloaded(state))
    except ApiError as exc:
        return error_response(exc)
    if outcome.error is not None:
        return error_response(ApiError(500, f"the embedding failed: {outcome.error}", type="server_error", code="engine_error"))
    return Response(dumps(emb.response(name, req, outcome)), media_type="application/json")


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
