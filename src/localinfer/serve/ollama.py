"""Ollama's API on ``serve`` (``/api/...`` and ``/``): a translator. Each route maps Ollama's request
to what the OpenAI routes run (the core request, the engine, the embedding queue) and the answer back
to Ollama's shapes; limits, the key, queueing and cancellation are ``app``'s, shared with every route.

Errors are Ollama's ``{"error": "..."}`` with the HTTP status the OpenAI routes would send. The model
listings are ``ollama_models``'; chat and generate's wire shapes are ``ollama_wire``'s.
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
from localinfer.serve import ollama_models as om
from localinfer.serve import ollama_wire as wire
from localinfer.serve.engine import Overloaded
from localinfer.serve.ollama_wire import bad, ns
from localinfer.serve.protocol import ApiError, parse_body
from localinfer.serve.sending import call_checker, unenforced

if TYPE_CHECKING:
    from localinfer.serve.engine import Engine

VERSION = "0.12.0"  # the Ollama API we speak (clients gate features such as tools and thinking on it)
RUNNING = "localinfer is running (Ollama's API on /api)"
# /metrics names each route's answers by these
ENDPOINTS = {"/": "ollama_root", "/api/version": "ollama_version", "/api/tags": "ollama_tags", "/api/show": "ollama_show",
             "/api/ps": "ollama_ps", "/api/chat": "ollama_chat", "/api/generate": "ollama_generate",
             "/api/embed": "ollama_embed", "/api/embeddings": "ollama_embeddings"}  # fmt: skip
MANAGE = {"pull": "localinfer pull MODEL", "push": None, "create": None, "copy": None, "delete": "localinfer rm MODEL"}


def error(exc: ApiError) -> JSONResponse:
    return JSONResponse(wire.error_body(exc), status_code=exc.status, headers=exc.headers)


@dataclass(frozen=True)
class Shared:
    """What these routes share with the OpenAI ones, handed over by ``app`` (which imports this
    module; this one imports nothing of it): the key check, the loaded engine, the bounded body,
    the full queue's refusal, queueing a request, the answer that streams and cancels, and which
    model names the server answers."""

    authorize: Callable[[Request, Any], None]
    engine: Callable[[Any], Engine]
    read_body: Callable[[Request, int], Awaitable[bytes]]
    overloaded: Callable[[Any], ApiError]
    queue: Callable[..., Awaitable[tuple[Any, Any, str, Any]]]
    respond: Callable[..., Response]  # app.AnswerResponse
    serves: Callable[[tuple[str, ...], str | None], bool]


@dataclass(frozen=True)
class Ask:
    """One request's context: the server's state (``app.ServerState``) and what is shared."""

    request: Request
    state: Any
    shared: Shared

    async def body(self) -> dict[str, Any]:
        return parse_body(await self.shared.read_body(self.request, self.state.config.max_body))


Handler = Callable[[Ask], Awaitable[Response]]


def _route(handler: Handler, shared: Shared) -> Callable[[Request], Awaitable[Response]]:
    """A handler behind the key check, its refusals in Ollama's shape."""

    async def endpoint(request: Request) -> Response:
        state = request.app.state.serve
        try:
            shared.authorize(request, state)
            return await handler(Ask(request, state, shared))
        except Overloaded:
            return error(shared.overloaded(state))
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


async def pick(ask: Ask, name: str, body: dict[str, Any]) -> Engine:
    """The engine that answers ``name``: this server's one model, or (serving every installed model)
    the router's, with Ollama's ``keep_alive`` and ``options.num_ctx`` for that model."""
    state = ask.state
    if state.router is None:
        engine = ask.shared.engine(state)
        await check_model(ask, name)
        return engine
    options = body.get("options") if isinstance(body.get("options"), dict) else {}
    engine: Engine = (await state.router.engine_for(ask.request.scope, name, keep_alive=body.get("keep_alive"),
                                                    num_ctx=options.get("num_ctx")))[0]  # fmt: skip
    return engine


async def check_model(ask: Ask, name: str) -> None:
    """A request for ``name`` is answered here: our names (with or without ``:latest``), or any name
    ``serves`` takes - unless it is another installed model, which this server has not loaded (404)."""
    state = ask.state
    if name in state.names or name.removesuffix(":latest") in state.names:
        return
    engine = state.engine
    models = await run_in_threadpool(om.catalog, engine.loaded if engine else None, state.names)
    found = om.find(models, name)
    if found is not None and found.served:
        return
    if found is not None or not ask.shared.serves(state.names, name):
        what = "is installed but not loaded here" if found is not None else "not found"
        raise ApiError(404, f"model '{name}' {what}: this server serves {state.names[0]} "
                            f"(start `localinfer serve -m {name}` to serve it)", param="model")  # fmt: skip


# -- what does not generate ---------------------------------------------------------------------------
async def root(request: Request) -> Response:
    """Liveness, as Ollama answers ``GET /`` and ``HEAD /`` (no key needed: it says nothing else)."""
    return PlainTextResponse(RUNNING)


async def version(ask: Ask) -> Response:
    from localinfer import __version__

    return JSONResponse({"version": VERSION, "localinfer": __version__})


async def tags(ask: Ask) -> Response:
    state = ask.state
    if state.router is not None:
        return JSONResponse({"models": await run_in_threadpool(state.router.tags)})
    engine = state.engine
    models = await run_in_threadpool(om.catalog, engine.loaded if engine else None, state.names)
    return JSONResponse({"models": [m.tag() for m in models]})


async def show(ask: Ask) -> Response:
    state = ask.state
    body = await ask.body()
    name = model_field(body, names=("model", "name"))
    engine = state.engine
    loaded = engine.loaded if engine else None
    models = await run_in_threadpool(om.catalog, loaded, state.names)
    facts = om.find(models, name)
    if facts is None:
        raise ApiError(404, f"model '{name}' not found", param="model")
    if facts.served and loaded is not None:  # the loaded model's own template (a registry's, when the GGUF has none)
        info = loaded.resolved.info if loaded.resolved is not None else None
        template = loaded.template.template if loaded.template is not None else None
    else:
        info = await run_in_threadpool(om.header, facts)
        template = info.chat_template if info is not None else None
    vision = facts.vision or (facts.served and loaded is not None and loaded.projector is not None)
    return JSONResponse(om.show(facts, info, template, vision))


async def ps(ask: Ask) -> Response:
    state = ask.state
    if state.router is not None:
        return JSONResponse({"models": await run_in_threadpool(state.router.ollama_ps)})
    engine = state.engine
    if engine is None:
        return JSONResponse({"models": []})
    facts = (await run_in_threadpool(om.catalog, engine.loaded, state.names))[0]
    return JSONResponse({"models": [om.running(facts, engine.loaded, engine.n_ctx_seq)]})


async def manage(ask: Ask) -> Response:
    """pull, push, create, copy, delete: the store is managed by the CLI, not through the server."""
    what = ask.request.url.path.rsplit("/", 1)[-1]
    instead = MANAGE.get(what)
    hint = f": use `{instead}`" if instead else ""
    raise ApiError(501, f"/api/{what} is not supported by this server{hint}")


# -- chat and generate ----------------------------------------------------------------------------------
async def chat(ask: Ask) -> Response:
    return await _answer(ask, "chat")


async def generate(ask: Ask) -> Response:
    return await _answer(ask, "generate")


async def _answer(ask: Ask, kind: str) -> Response:
    """Ollama's request as the core's, queued as every route's is (``app.queue``), its answer sent by
    ``app.AnswerResponse`` in Ollama's objects (``ollama_wire.OllamaAnswer``)."""
    state, body = ask.state, await ask.body()
    name = model_field(body)
    t0 = time.perf_counter()
    engine = await pick(ask, name, body)
    # Ollama's load_duration: the load this request started or waited for (one model: always loaded)
    load_s = time.perf_counter() - t0 if state.router is not None else 0.0
    template = engine.loaded.template
    if kind == "chat":  # a format's or tool's schema checks: off the loop, as every route's
        asked = await run_in_threadpool(wire.parse_chat, body, name)
    else:
        asked = await run_in_threadpool(lambda: wire.parse_generate(body, name, templated=template is not None))
    writer = wire.OllamaAnswer(kind, name, load_s)
    if asked.request is None:  # nothing to generate: Ollama's "load the model" (it is loaded)
        return JSONResponse(writer.loaded())
    if asked.think and "thinking" not in om.capabilities(template.template if template else None, None):
        raise ApiError(400, f"'think': {name} does not support thinking (its template writes no reasoning markers)", param="think")
    ticket, channel, mode, _ = await ask.shared.queue(state, engine, asked.request)
    core = asked.request.request
    return ask.shared.respond(ticket, channel, writer, mode, wire.error_body, unenforced(core), call_checker(core, state.say))


# -- embeddings ---------------------------------------------------------------------------------------
async def embed(ask: Ask) -> Response:
    """``/api/embed``: ``input`` a string or a list of them, ``truncate`` (default true), ``dimensions``."""
    from localinfer.serve import embeddings as emb

    body = await ask.body()
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
    vectors, tokens, total_s = await _embed(ask, name, req, truncate, body)
    return JSONResponse({"model": name, "embeddings": vectors, "total_duration": ns(total_s), "load_duration": 0,
                         "prompt_eval_count": tokens})  # fmt: skip


async def embeddings(ask: Ask) -> Response:
    """``/api/embeddings``, the older shape: one ``prompt``, one ``embedding``."""
    from localinfer.serve import embeddings as emb

    body = await ask.body()
    name = model_field(body)
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise bad("prompt", f"'prompt' must be a non-empty string, not {rules.shown(prompt)}")
    vectors, _, _ = await _embed(ask, name, emb.parse({"input": prompt}), False, body)
    return JSONResponse({"embedding": vectors[0]})


async def _embed(ask: Ask, name: str, req: Any, truncate: bool, body: dict[str, Any]) -> tuple[list[list[float]], int, float]:
    from localinfer.serve import embeddings as emb

    engine = await pick(ask, name, body)
    t0 = time.perf_counter()
    tokens = await run_in_threadpool(lambda: emb.tokenize(engine, req, truncate=truncate))
    outcome = await emb.run(engine, tokens, ask.request.receive)  # a disconnect cancels it
    if outcome.error is not None:
        raise ApiError(500, f"the embedding failed: {outcome.error}", type="server_error")
    return outcome.vectors, outcome.tokens, time.perf_counter() - t0


def routes(shared: Shared) -> list[Route]:
    """Every Ollama route, for ``app.create_app`` (HEAD / comes with GET /)."""
    out = [Route("/", root, methods=["GET", "HEAD"]),
           Route("/api/version", _route(version, shared), methods=["GET"]),
           Route("/api/tags", _route(tags, shared), methods=["GET"]),
           Route("/api/ps", _route(ps, shared), methods=["GET"]),
           Route("/api/show", _route(show, shared), methods=["POST"]),
           Route("/api/chat", _route(chat, shared), methods=["POST"]),
           Route("/api/generate", _route(generate, shared), methods=["POST"]),
           Route("/api/embed", _route(embed, shared), methods=["POST"]),
           Route("/api/embeddings", _route(embeddings, shared), methods=["POST"])]  # fmt: skip
    out += [Route(f"/api/{what}", _route(manage, shared), methods=["POST", "DELETE"]) for what in MANAGE]
    return out
