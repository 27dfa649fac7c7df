"""The HTTP app: its routes, middleware and error handlers; OpenAI's Chat Completions and
Completions (``protocol``, ``responses``), Anthropic's Messages (``anthropic``) and OpenAI's
Responses (``responses_api``) as ``Wire``s, each run through the one exchange (``exchange.answer``:
accept, parse, pick the model, queue, write) that Ollama's routes (``ollama``) run too; /health,
/metrics and /v1/models. No model logic here, and no route asks which models are served
(``multi.Served`` knows). An answer is sent by ``AnswerResponse``, which also listens for the client
going away: the request is cancelled then, and its sequence is free at the engine's next step.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from localinfer.serve.models import listings

from localinfer.serve.wires import catalog as wires
from localinfer.serve.scheduler.worker import Overloaded
from localinfer.serve.http.exchange import ServerState, Wire, accept, answer, authorize, overloaded, pick, prepared_only, state_of, wire_error
from localinfer.serve.http.guard import Guard, allowed_names, error_body
from localinfer.serve.http.metrics import Metrics
from localinfer.serve.wires.openai import ApiError
from localinfer.serve.wires.chat_completions import dumps
from localinfer.serve.http.sending import STATUS_KEY

__all__ = ["ServerState", "create_app"]

ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/embeddings": "embeddings",
             "/v1/models": "models", "/health": "health", "/metrics": "metrics", **{
             "/v1/messages": "messages", "/v1/messages/count_tokens": "count_tokens", "/v1/responses": "responses"}}  # fmt: skip


def create_app(state: ServerState, *, completions: dict[str, Wire] | None = None) -> Starlette:
    """The app serving ``state``. ``completions``: the wires of OpenAI's two routes by kind ("chat",
    "text"), where a server wants its own (the resident server's ``catalog.WHOLE``)."""
    from localinfer.request import checker
    from localinfer.serve.wires import llama as llama_routes
    from localinfer.serve.wires.ollama import routes as ollama
    from localinfer.serve.models.multi import Leases

    checker.enable()  # large schemas and grammars are checked in a helper process, off the loop's GIL

    wire_of = {"chat": wires.CHAT, "text": wires.COMPLETIONS, **(completions or {})}
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", _answering(wire_of["chat"]), methods=["POST"]),
        Route("/v1/completions", _answering(wire_of["text"]), methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        *protocol_routes(),
        *llama_routes.routes(),
        *ollama.routes(),
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


# -- routes ---------------------------------------------------------------------------------------
async def health(request: Request) -> Response:
    """503 while the model loads, 200 once requests can be answered (no key needed: for probes)."""
    if not state_of(request).models.ready():
        return error_response(ApiError(503, "the model is loading", type="unavailable_error", code="model_loading"))
    return JSONResponse({"status": "ok"})


async def metrics(request: Request) -> Response:
    state = state_of(request)
    authorize(request, state)
    served = state.models
    text = state.metrics.render(served.gauges(), functools.partial(listings.metrics_text, served))
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def models(request: Request) -> Response:
    state = state_of(request)
    authorize(request, state)
    return JSONResponse(await run_in_threadpool(listings.openai_models, state.models, state.created))


def protocol_routes() -> list[Route]:
    """The routes of the protocols beside OpenAI's Chat Completions (one place to add one)."""
    return [
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
    ]


def _answering(wire: Wire) -> Callable[[Request], Awaitable[Response]]:
    """The route of a protocol that is one ``Wire`` (OpenAI's Chat Completions, its Completions)."""

    async def route(request: Request) -> Response:
        return await answer(request, wire)

    return route


async def messages(request: Request) -> Response:
    return await answer(request, wires.messages())


async def count_tokens(request: Request) -> Response:
    """Anthropic's count_tokens: the prompt's tokens, as the request's usage.input_tokens counts them."""
    wire = wires.messages(counting=True)
    try:
        _, prepared = await prepared_only(request, wire)
    except Overloaded:
        return wire_error(wire, overloaded(state_of(request)))
    except ApiError as exc:
        return wire_error(wire, exc)
    return JSONResponse({"input_tokens": len(prepared.tokens)})


async def responses(request: Request) -> Response:
    return await answer(request, wires.responses())


async def embeddings(request: Request) -> Response:
    from localinfer.serve.wires import embeddings as emb
    state = state_of(request)
    try:
        req = await accept(request, state, emb.parse)
        picked = await pick(request, state, req.model)
        tokens = await run_in_threadpool(emb.tokenize, picked.engine, req)
        outcome = await emb.run(picked.engine, tokens, request.receive)  # a disconnect cancels it
    except Overloaded:
        return error_response(overloaded(state))
    except ApiError as exc:
        return error_response(exc)
    if outcome.error is not None:
        return error_response(ApiError(500, f"the embedding failed: {outcome.error}", type="server_error", code="engine_error"))
    return Response(dumps(emb.response(picked.name, req, outcome)), media_type="application/json")
