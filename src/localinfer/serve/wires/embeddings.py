"""``POST /v1/embeddings``, as OpenAI's: ``input`` a string, a list of strings, token ids or a list
of token-id lists; ``encoding_format`` float or base64 (little-endian float32, which the official
client decodes); ``dimensions`` only the model's own. Checked field by field (400 naming the field),
tokenized here, embedded on the engine thread (``Engine.submit_embed``: queued and bounded as chat
requests are, in the embedding context the engine makes on first use, one decode per engine step).
A request holds at most ``MAX_TOKENS`` tokens in all (400 naming the cap), and a client that
disconnects cancels its request before the next of its decodes (docs/security.md).
"""

from __future__ import annotations

import asyncio
import base64
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.request import rules
from localinfer.serve.wires.openai import ApiError, field_error, field_errors

if TYPE_CHECKING:
    from localinfer.serve.scheduler.worker import EmbedOutcome, Engine

MAX_INPUTS = 2048  # OpenAI's limit per request
MAX_TOKENS = 300_000  # OpenAI's limit on a request's tokens, all inputs together
_FIELDS = {"input", "model", "encoding_format", "dimensions", "user"}


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str | None
    inputs: tuple[str | tuple[int, ...], ...]
    base64: bool = False
    dimensions: int | None = None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _inputs(value: Any) -> tuple[str | tuple[int, ...], ...]:
    """OpenAI's four shapes of ``input``, as a tuple of texts and token-id tuples."""
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and all(_is_int(t) for t in value):
        value = [value]  # one input given as token ids
    if not isinstance(value, list):
        raise field_error("input", f"'input' must be a string or a list of strings or of token-id lists, not {rules.shown(value)}", "invalid_type")
    if not value:
        raise field_error("input", "'input' must not be an empty list")
    if len(value) > MAX_INPUTS:
        raise field_error("input", f"'input' has {len(value)} items; a request may have {MAX_INPUTS}")
    out: list[str | tuple[int, ...]] = []
    for i, item in enumerate(value):
        name = f"input[{i}]"
        if isinstance(item, str):
            if not item:
                raise field_error(name, f"'{name}' is an empty string: nothing to embed")
            out.append(rules.text(name, item))
        elif isinstance(item, list) and item and all(_is_int(t) and t >= 0 for t in item):
            out.append(tuple(item))
        else:
            raise field_error(name, f"'{name}' must be a non-empty string or a non-empty list of token ids, not {rules.shown(item)}", "invalid_type")
    return tuple(out)


@field_errors()
def parse(body: dict[str, Any]) -> EmbeddingRequest:
    for name in body:
        if name not in _FIELDS:
            raise field_error(name, f"unknown field '{name}'", "unknown_parameter")
    if "input" not in body:
        raise field_error("input", "'input' is required", "missing_parameter")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise field_error("encoding_format", f"'encoding_format' must be float or base64, not {rules.shown(fmt)}")
    dims = body.get("dimensions")
    if dims is not None and not (_is_int(dims) and dims > 0):
        raise field_error("dimensions", f"'dimensions' must be a positive integer, not {rules.shown(dims)}", "invalid_type")
    model = body.get("model")
    if model is not None:
        model = rules.model_name("model", model)
    if body.get("user") is not None:
        rules.text("user", body["user"])
    return EmbeddingRequest(model, _inputs(body["input"]), fmt == "base64", dims)


def tokenize(engine: Engine, req: EmbeddingRequest, *, truncate: bool = False) -> list[list[int]]:
    """Every input's tokens, checked against the embedding context (any thread): 400 naming the input;
    ``truncate``: a longer input is cut to fit (Ollama's default) instead."""
    from localinfer.engine.embed import embedding_size, input_tokens
    from localinfer.errors import ContextOverflowError, UsageError

    model = engine.loaded.model
    if req.dimensions is not None and req.dimensions != (n := embedding_size(model)):
        raise field_error("dimensions", f"'dimensions' {req.dimensions} is not supported: this model's embeddings have {n} (it cannot shorten them)",
                   "unsupported_parameter")  # fmt: skip
    out, total = [], 0
    for i, item in enumerate(req.inputs):
        try:
            tokens, _ = input_tokens(model, item, engine.embed_ctx, truncate=truncate)
        except ContextOverflowError as exc:
            raise ApiError(400, f"input[{i}]: {exc} (--embedding-ctx)", code="context_length_exceeded", param=f"input[{i}]") from None
        except UsageError as exc:
            raise field_error(f"input[{i}]", f"input[{i}]: {exc}") from None
        total += len(tokens)
        if total > MAX_TOKENS:
            raise ApiError(400, f"'input' has more than {MAX_TOKENS} tokens in all (over the cap at input[{i}]); "
                           f"a request may have {MAX_TOKENS}: send fewer inputs per request",
                           code="context_length_exceeded", param="input")  # fmt: skip
        out.append(tokens)
    return out


def _encoded(vec: list[float], as_base64: bool) -> list[float] | str:
    if not as_base64:
        return vec
    return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode("ascii")


def response(name: str, req: EmbeddingRequest, outcome: EmbedOutcome) -> dict[str, Any]:
    data = [{"object": "embedding", "index": i, "embedding": _encoded(v, req.base64)} for i, v in enumerate(outcome.vectors)]
    usage = {"prompt_tokens": outcome.tokens, "total_tokens": outcome.tokens}
    return {"object": "list", "data": data, "model": name, "usage": usage}


async def run(engine: Engine, tokens: list[list[int]], receive: Callable[[], Awaitable[dict]] | None = None) -> EmbedOutcome:
    """Queue the work on the engine thread and wait for it (``Overloaded`` when the queue is full);
    ``receive``: the request's ASGI receive, its body read - the client disconnecting cancels the work."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[EmbedOutcome] = loop.create_future()

    def on_end(outcome: EmbedOutcome) -> None:  # the engine thread
        def settle() -> None:
            if not done.done():
                done.set_result(outcome)

        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    ticket = engine.submit_embed(tokens, on_end)
    gone = asyncio.ensure_future(_disconnected(receive)) if receive is not None else None
    try:
        if gone is not None:
            await asyncio.wait((done, gone), return_when=asyncio.FIRST_COMPLETED)
            if not done.done():
                ticket.cancel()  # ended before its next decode: answered (to nobody) as cancelled
        return await done
    except asyncio.CancelledError:
        ticket.cancel()
        raise
    finally:
        if gone is not None:
            gone.cancel()


async def _disconnected(receive: Callable[[], Awaitable[dict]]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
