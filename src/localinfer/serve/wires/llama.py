"""llama-server's endpoints that agents and editors count with, in its shapes: ``/tokenize``,
``/detokenize``, ``/apply-template``, ``/props``, and the prompt's size without generating
(``/v1/chat/completions/input_tokens``, OpenAI's ``/v1/responses/input_tokens``).

Nothing here generates. What renders or tokenizes runs off the event loop, bounded as count_tokens
is (``exchange.off_loop``: at most --max-queue at once); a chat request is prepared by the very path a
generating one takes (``exchange.prepared_only`` -> ``serve.scheduler.prepare``), so a count or a rendered prompt
can never disagree with what generation evaluates. A ``model`` field (``?model=`` on /props) picks
the model as every route's does (``exchange.pick``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localinfer.serve.wires import catalog as wires
from localinfer.serve.scheduler.worker import Overloaded
from localinfer.serve.http.exchange import Wire, authorize, body_of, off_loop, overloaded, pick, prepared_only, state_of
from localinfer.serve.wires.openai import ApiError

if TYPE_CHECKING:
    from localinfer.engine.templates import ChatTemplate
    from localinfer.serve.scheduler.worker import Engine

ENDPOINTS = {"/tokenize": "tokenize", "/detokenize": "detokenize", "/apply-template": "apply_template", "/props": "props",
             "/v1/chat/completions/input_tokens": "input_tokens", "/v1/responses/input_tokens": "input_tokens"}  # fmt: skip


def routes() -> list[Route]:
    """Every route here, for ``app.create_app``."""
    paths = {"/tokenize": tokenize, "/detokenize": detokenize, "/apply-template": apply_template, "/props": props,
             "/v1/chat/completions/input_tokens": chat_input_tokens, "/v1/responses/input_tokens": responses_input_tokens}  # fmt: skip
    return [Route(path, fn, methods=["GET" if path == "/props" else "POST"]) for path, fn in paths.items()]


# -- the prompt a chat request makes, without generating ----------------------------------------------
async def apply_template(request: Request) -> Response:
    """The prompt text generation evaluates for this chat request: its tokens written out (special
    tokens as text, a BOS that tokenizing adds included), so tokenizing it gives the same count."""
    async def run() -> dict[str, Any]:
        picked, prepared = await prepared_only(request, wires.CHAT)
        return {"prompt": await off_loop(state_of(request), functools.partial(_prompt_text, picked.engine, prepared.tokens))}

    return await _answered(request, run, wires.CHAT.error)


async def chat_input_tokens(request: Request) -> Response:
    async def run() -> dict[str, Any]:
        _, prepared = await prepared_only(request, wires.CHAT)
        return {"object": "chat.completion.input_tokens", "input_tokens": len(prepared.tokens)}

    return await _answered(request, run, wires.CHAT.error)


async def responses_input_tokens(request: Request) -> Response:
    """OpenAI's ``POST /v1/responses/input_tokens``: a Responses request's prompt, counted."""
    from localinfer.serve.wires import responses as ra
    async def run() -> dict[str, Any]:
        _, prepared = await prepared_only(request, Wire(ra.parse, ra.error_body, lambda *_: None))
        return {"object": "response.input_tokens", "input_tokens": len(prepared.tokens)}

    return await _answered(request, run, ra.error_body)


def _prompt_text(engine: Engine, tokens: Any) -> str:
    """The tokens' bytes joined before decoding (a character split across two tokens stays whole);
    an image's positions are its marker, once (``engine.vision.MediaPrompt``)."""
    model, out = engine.loaded.model, bytearray()
    pieces = getattr(tokens, "pieces", None)
    if pieces is None:
        pieces = [(0, len(tokens), None)]
    for start, n, image in pieces:
        if image is not None:
            out += engine.loaded.projector.marker.encode()
            continue
        for t in tokens[start : start + n]:
            out += model.token_bytes(t)
    return out.decode("utf-8", errors="replace")


# -- text to tokens and back ----------------------------------------------------------------------------
async def tokenize(request: Request) -> Response:
    """``{"content", "add_special"?: false, "parse_special"?: true, "with_pieces"?: false}`` ->
    ``{"tokens": [id...]}``, or ``[{"id", "piece"}...]`` where a piece that is not whole UTF-8 is its bytes."""
    async def run() -> dict[str, Any]:
        body = await _body(request, {"content", "add_special", "parse_special", "with_pieces"})
        content = body.get("content")
        if not isinstance(content, str):
            raise _bad("content", "'content' is required: the text to tokenize" if content is None else "'content' must be a string")
        add, special, pieces = (_flag(body, k, d) for k, d in (("add_special", False), ("parse_special", True), ("with_pieces", False)))
        engine = await _engine(request, body)
        return {"tokens": await off_loop(state_of(request), functools.partial(_tokens, engine, content, add, special, pieces))}

    return await _answered(request, run)


def _tokens(engine: Engine, content: str, add: bool, special: bool, pieces: bool) -> list[Any]:
    model = engine.loaded.model
    ids = model.tokenize(content, add_special=add, parse_special=special)
    if not pieces:
        return ids
    out = []
    for t in ids:
        raw = model.token_bytes(t)
        try:
            piece: Any = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)
        out.append({"id": t, "piece": piece})
    return out


async def detokenize(request: Request) -> Response:
    """``{"tokens": [id...]}`` -> ``{"content"}``: special tokens written out, as llama-server does."""
    async def run() -> dict[str, Any]:
        body = await _body(request, {"tokens"})
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise _bad("tokens", "'tokens' must be a list of token ids")
        engine = await _engine(request, body)
        model = engine.loaded.model
        bad = next((t for t in ids if not 0 <= t < model.n_vocab), None)
        if bad is not None:
            raise _bad("tokens", f"token id {bad} is out of the vocabulary ({model.n_vocab} tokens)")
        text = await off_loop(state_of(request), lambda: b"".join(map(model.token_bytes, ids)).decode("utf-8", errors="replace"))
        return {"content": text}

    return await _answered(request, run)


# -- the server's and the model's facts --------------------------------------------------------------------
async def props(request: Request) -> Response:
    """llama-server's ``GET /props``: one sequence's context, the slots, the model (its name: a path
    would tell a client the user's home), its chat template and what the template can do."""
    async def run() -> dict[str, Any]:
        state = state_of(request)
        authorize(request, state)
        picked = await pick(request, state, request.query_params.get("model"))
        engine, name = picked.engine, picked.name
        template = engine.loaded.template
        caps = await off_loop(state, functools.partial(template_caps, template))
        return {
            "default_generation_settings": {"n_ctx": engine.n_ctx_seq},
            "total_slots": engine.parallel,
            "model_alias": _shown(name),
            "model_path": _shown(name),
            "chat_template": (template.template if template is not None else None) or "",
            "chat_template_caps": caps,
            "modalities": {"vision": engine.vision, "audio": False},
            "build_info": _build_info(),
        }

    return await _answered(request, run)


def _shown(name: str) -> str:
    """A name that is a file's path (``serve -m /path/x.gguf``) as the file's name alone."""
    from pathlib import PurePath

    return PurePath(name).name if PurePath(name).is_absolute() or name.startswith(("~", ".")) or name.endswith(".gguf") else name


@functools.lru_cache(maxsize=32)
def template_caps(template: ChatTemplate | None) -> dict[str, bool]:
    """What the template does with what a client may send, found as llama.cpp finds it (minja's
    caps): a marker in each probe rendered shows it is taken; a template that refuses it does not."""
    from localinfer.request import reasoning

    def shows(markers: tuple[str, ...], messages: list[dict[str, Any]], generation: bool = True, **variables: Any) -> bool:
        if template is None:
            return False
        try:
            text = template.render(messages, add_generation_prompt=generation, **variables).text
        except Exception:  # a template's raise_exception, or a part it cannot read: not supported
            return False
        return all(m in text for m in markers)

    user = {"role": "user", "content": "hi"}
    tool = {"type": "function", "function": {"name": "probe_tool_7f", "description": "a probe",
                                             "parameters": {"type": "object", "properties": {}}}}  # fmt: skip

    def calls(*names: str) -> list[dict[str, Any]]:  # both argument forms: templates read one or the other
        return [[user, {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call_{n}", "type": "function", "function": {"name": n, "arguments": args}} for n in names]}]
            for args in ({"a": 1}, '{"a": 1}')]  # fmt: skip

    return {
        "supports_system_role": shows(("probe_system_7f",), [{"role": "system", "content": "probe_system_7f"}, user]),
        "supports_tools": shows(("probe_tool_7f",), [user], tools=[tool]),
        "supports_tool_calls": any(shows(("probe_call_7f",), m, False) for m in calls("probe_call_7f")),
        "supports_parallel_tool_calls": any(shows(("probe_a_7f", "probe_b_7f"), m, False) for m in calls("probe_a_7f", "probe_b_7f")),
        "supports_thinking": reasoning.detect(template.template if template is not None else None) is not None,
    }


@functools.lru_cache(maxsize=1)
def _build_info() -> str:
    from importlib import metadata

    from localinfer import __version__

    try:  # the package's metadata: importing llama_cpp here would load the library for a string
        backend = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        backend = "unknown"
    return f"localinfer-{__version__} (llama-cpp-python {backend})"


# -- shared ----------------------------------------------------------------------------------------------
async def _answered(request: Request, run: Callable[[], Any],
                    error: Callable[[ApiError], dict[str, Any]] = ApiError.body) -> Response:  # fmt: skip
    """``run``'s answer as JSON, or its error in the route's shape (an overload: 503, Retry-After)."""
    try:
        return JSONResponse(await run())
    except Overloaded:
        exc = overloaded(state_of(request))
    except ApiError as caught:
        exc = caught
    return JSONResponse(error(exc), status_code=exc.status, headers=exc.headers)


async def _body(request: Request, fields: set[str]) -> dict[str, Any]:
    """The key checked, the body read (--max-body) and parsed; an unknown field is a 400, as elsewhere."""
    body = await body_of(request, state_of(request))
    unknown = sorted(set(body) - fields - {"model"})
    if unknown:
        raise ApiError(400, f"unknown field '{unknown[0]}'", code="unknown_parameter", param=unknown[0])
    return body


async def _engine(request: Request, body: dict[str, Any]) -> Engine:
    from localinfer.request import rules

    model = body.get("model")
    try:
        model = None if model is None else rules.model_name("model", model)
    except rules.RuleError as exc:
        raise _bad("model", str(exc)) from None
    return (await pick(request, state_of(request), model)).engine


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false", code="invalid_type", param=name)
    return value


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, code="invalid_value", param=param)

