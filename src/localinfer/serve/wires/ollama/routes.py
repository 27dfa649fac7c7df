"""Ollama's API on ``serve`` (``/api/...`` and ``/``): a translator. Each route maps Ollama's request
to what the OpenAI routes run (the core request, the engine, the embedding queue) and the answer back
to Ollama's shapes; chat and generate are a ``Wire`` through the one exchange (``exchange.answer``),
so limits, the key, parsing before a model is picked, queueing and cancellation are every route's.

Errors are Ollama's ``{"error": "..."}`` with the HTTP status the OpenAI routes would send. The model
listings are ``listings``' and ``ollama_models``'; chat and generate's wire shapes are ``ollama_wire``'s.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from localinfer.request import rules
from localinfer.serve.models import listings
from localinfer.serve.wires.ollama import models as om
from localinfer.serve.wires.ollama import chat as wire
from localinfer.serve.scheduler.worker import Overloaded
from localinfer.serve.http.exchange import Wire, answer, overloaded, pick, state_of
from localinfer.serve.models.multi import keep_alive_seconds, num_ctx_tokens
from localinfer.serve.wires.ollama.chat import bad, ns
from localinfer.serve.wires.openai import ApiError

if TYPE_CHECKING:
    from localinfer.serve.http.exchange import ServerState
    from localinfer.serve.models.multi import Picked

VERSION = "0.12.0"  # the Ollama API we speak (clients gate features such as tools and thinking on it)
RUNNING = "localinfer is running (Ollama's API on /api)"
# /metrics names each route's answers by these
ENDPOINTS = {"/": "ollama_root", "/api/version": "ollama_version", "/api/tags": "ollama_tags", "/api/show": "ollama_show",
             "/api/ps": "ollama_ps", "/api/chat": "ollama_chat", "/api/generate": "ollama_generate",
             "/api/embed": "ollama_embed", "/api/embeddings": "ollama_embeddings"}  # fmt: skip
MANAGE = {"pull": "localinfer pull MODEL", "push": None, "create": None, "copy": None, "delete": "localinfer rm MODEL"}


def error(exc: ApiError) -> JSONResponse:
    return JSONResponse(wire.error_body(exc), status_code=exc.status, headers=exc.headers)


Handler = Callable[[Request, "ServerState"], Awaitable[Response]]


def _route(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A handler behind the key check, its refusals in Ollama's shape."""
    from localinfer.serve.http.exchange import authorize

    async def endpoint(request: Request) -> Response:
        state = state_of(request)
        try:
            authorize(request, state)
            return await handler(request, state)
        except Overloaded:
            return error(overloaded(state))
        except ApiError as exc:
            return error(exc)
        except rules.RuleError as exc:
            return error(bad(exc.field, str(exc)))

    endpoint.__name__ = handler.__name__
    return endpoint


def model_field(body: dict[str, Any], *, names: tuple[str, ...] = ("model",)) -> str:
    """The model a request names (Ollama requires one; ``name`` is its older spelling)."""
    value = next((body[n] for n in names if body.get(n) is not None), None)
    if value is None:
        raise bad(names[0], f"'{names[0]}' is required")
    name = rules.model_name(names[0], value)
    if not name:
        raise bad(names[0], f"'{names[0]}' must not be empty")
    return name


async def _body(request: Request, state: ServerState) -> dict[str, Any]:
    from localinfer.serve.http.exchange import read_body
    from localinfer.serve.wires.openai import parse_body

    return parse_body(await read_body(request, state.config.max_body))


def load_fields(body: dict[str, Any]) -> dict[str, Any]:
    """Ollama's per-request load fields (``keep_alive``, ``options.num_ctx``), checked as ``Served.pick`` takes them."""
    options = body.get("options") if isinstance(body.get("options"), dict) else {}
    fields = {"keep_alive": body.get("keep_alive"), "num_ctx": options.get("num_ctx")}
    keep_alive_seconds(fields["keep_alive"]), num_ctx_tokens(fields["num_ctx"])  # a 400 before any model is picked
    return fields


# -- what does not generate ---------------------------------------------------------------------------
async def root(request: Request) -> Response:
    """Liveness, as Ollama answers ``GET /`` and ``HEAD /`` (no key needed: it says nothing else)."""
    return PlainTextResponse(RUNNING)


async def version(request: Request, state: ServerState) -> Response:
    from localinfer import __version__

    return JSONResponse({"version": VERSION, "localinfer": __version__})


async def tags(request: Request, state: ServerState) -> Response:
    return JSONResponse({"models": await run_in_threadpool(listings.tags, state.models)})


async def show(request: Request, state: ServerState) -> Response:
    name = model_field(await _body(request, state), names=("model", "name"))
    models = await run_in_threadpool(listings.catalog, state.models)
    facts = om.find(models, name)
    if facts is None:
        raise ApiError(404, f"model '{name}' not found", param="model")
    kept = listings.loaded_as(state.models, facts)
    loaded = kept.held.engine.loaded if kept is not None else None
    if loaded is not None:  # the loaded model's own template (a registry's, when the GGUF has none)
        info = loaded.resolved.info if loaded.resolved is not None else None
        template = loaded.template.template if loaded.template is not None else None
    else:
        info = await run_in_threadpool(om.header, facts)
        template = info.chat_template if info is not None else None
    vision = facts.vision or (loaded is not None and loaded.projector is not None)
    return JSONResponse(om.show(facts, info, template, vision))


async def ps(request: Request, state: ServerState) -> Response:
    return JSONResponse({"models": await run_in_threadpool(listings.ollama_ps, state.models)})


async def manage(request: Request, state: ServerState) -> Response:
    """pull, push, create, copy, delete: the store is managed by the CLI, not through the server."""
    what = request.url.path.rsplit("/", 1)[-1]
    instead = MANAGE.get(what)
    hint = f": use `{instead}`" if instead else ""
    raise ApiError(501, f"/api/{what} is not supported by this server{hint}")


# -- chat and generate ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Asked:
    """An Ollama chat or generate request, parsed whole before its model is picked: the model's
    name, its load fields, the request (as if the model has a chat template) and the body (a
    generate request is parsed again for a model without one: its prompt then goes as it is)."""

    kind: str  # chat | generate
    model: str
    fields: dict[str, Any]
    parsed: wire.OllamaRequest
    body: dict[str, Any]


def _parse(kind: str, body: dict[str, Any]) -> Asked:
    try:
        name = model_field(body)
    except rules.RuleError as exc:
        raise bad(exc.field, str(exc)) from None
    fields = load_fields(body)
    parsed = wire.parse_chat(body, name) if kind == "chat" else wire.parse_generate(body, name, templated=True)
    return Asked(kind, name, fields, parsed, body)


async def _fit(asked: Asked, picked: Picked) -> Any:
    """The request for the model picked: a generate request's prompt as it is for a model without a
    template; a 400 for thinking its template cannot switch; Ollama's "load the model" answered now."""
    template = picked.engine.loaded.template
    parsed = asked.parsed
    if asked.kind == "generate" and template is None:
        parsed = await run_in_threadpool(lambda: wire.parse_generate(asked.body, asked.model, templated=False))
    if parsed.request is None:  # nothing to generate: Ollama's "load the model" (it is loaded)
        return JSONResponse(wire.OllamaAnswer(asked.kind, asked.model, picked.load_s).loaded())
    if parsed.think and "thinking" not in om.capabilities(template.template if template else None, None):
        raise ApiError(400, f"'think': {asked.model} does not support thinking (its template writes no reasoning markers)", param="think")
    return parsed.request


def _wire(kind: str) -> Wire:
    return Wire(lambda body: _parse(kind, body), wire.error_body, lambda picked, asked, prepared: wire.OllamaAnswer(kind, asked.model, picked.load_s),
                fields=lambda asked: asked.fields, fit=_fit)  # fmt: skip


CHAT, GENERATE = _wire("chat"), _wire("generate")


async def chat(request: Request) -> Response:
    return await answer(request, CHAT)


async def generate(request: Request) -> Response:
    return await answer(request, GENERATE)


# -- embeddings ---------------------------------------------------------------------------------------
async def embed(request: Request, state: ServerState) -> Response:
    """``/api/embed``: ``input`` a string or a list of them, ``truncate`` (default true), ``dimensions``."""
    from localinfer.serve.wires import embeddings as emb
    body = await _body(request, state)
    name = model_field(body)
    inputs = body.get("input")
    if inputs is None or inputs == "" or inputs == []:
        raise bad("input", "'input' is required: a string or a list of strings")
    if not isinstance(inputs, (str, list)) or (isinstance(inputs, list) and not all(isinstance(i, str) for i in inputs)):
        raise bad("input", f"'input' must be a string or a list of strings, not {rules.shown(inputs)}")
    truncate = body.get("truncate", True)
    if not isinstance(truncate, bool):
        raise bad("truncate", f"'truncate' must be true or false, not {rules.shown(truncate)}")
    req = emb.parse({"input": inputs, **({"dimensions": body["dimensions"]} if body.get("dimensions") is not None else {})})
    vectors, tokens, total_s = await _embed(request, state, name, req, truncate, body)
    return JSONResponse({"model": name, "embeddings": vectors, "total_duration": ns(total_s), "load_duration": 0,
                         "prompt_eval_count": tokens})  # fmt: skip


async def embeddings(request: Request, state: ServerState) -> Response:
    """``/api/embeddings``, the older shape: one ``prompt``, one ``embedding``."""
    from localinfer.serve.wires import embeddings as emb
    body = await _body(request, state)
    name = model_field(body)
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise bad("prompt", f"'prompt' must be a non-empty string, not {rules.shown(prompt)}")
    vectors, _, _ = await _embed(request, state, name, emb.parse({"input": prompt}), False, body)
    return JSONResponse({"embedding": vectors[0]})


async def _embed(request: Request, state: ServerState, name: str, req: Any, truncate: bool,
                 body: dict[str, Any]) -> tuple[list[list[float]], int, float]:  # fmt: skip
    from localinfer.serve.wires import embeddings as emb
    engine = (await pick(request, state, name, **load_fields(body))).engine
    t0 = time.perf_counter()
    tokens = await run_in_threadpool(lambda: emb.tokenize(engine, req, truncate=truncate))
    outcome = await emb.run(engine, tokens, request.receive)  # a disconnect cancels it
    if outcome.error is not None:
        raise ApiError(500, f"the embedding failed: {outcome.error}", type="server_error")
    return outcome.vectors, outcome.tokens, time.perf_counter() - t0


def routes() -> list[Route]:
    """Every Ollama route, for ``app.create_app`` (HEAD / comes with GET /)."""
    out = [Route("/", root, methods=["GET", "HEAD"]),
           Route("/api/version", _route(version), methods=["GET"]),
           Route("/api/tags", _route(tags), methods=["GET"]),
           Route("/api/ps", _route(ps), methods=["GET"]),
           Route("/api/show", _route(show), methods=["POST"]),
           Route("/api/chat", chat, methods=["POST"]),
           Route("/api/generate", generate, methods=["POST"]),
           Route("/api/embed", _route(embed), methods=["POST"]),
           Route("/api/embeddings", _route(embeddings), methods=["POST"])]  # fmt: skip
    out += [Route(f"/api/{what}", _route(manage), methods=["POST", "DELETE"]) for what in MANAGE]
    return out
