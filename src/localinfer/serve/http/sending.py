"""Sending one engine answer: how a request's answer reaches its channel (``submit``: raw text, logprobs
or steps), and ``AnswerResponse``, which streams it as a protocol's writer shapes it (or sends it
whole) while watching for the client to go away.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from localinfer.serve.scheduler.bridge import Channel
from localinfer.serve.wires.openai import ApiError
from localinfer.serve.wires.chat_completions import dumps
from localinfer.serve.wires.writer import WireWriter

if TYPE_CHECKING:
    from localinfer.serve.scheduler.worker import Engine, Ended, Ticket

STATUS_KEY = "localinfer.status"  # set in the scope by an answer whose status is not the one it sent (499)
KEEPALIVE_S = 10.0  # between keep-alive events while a stream waits for its first piece
UNENFORCED_HEADER = b"x-localinfer-unenforced"  # docs/tools.md: the tools' keywords the constraint left out


def submit(engine: Engine, prepared: Any, channel: Channel[Ended], stream: bool, logprobs: bool = False) -> tuple[Ticket, str]:
    """Queue a prepared request whose answer goes to ``channel``, and how it streams: ``whole`` (the
    outcome only), ``text`` (raw pieces: an answer that is all text), ``logprobs`` (pieces with their
    entries; calls are not parsed from them) or ``steps`` (``localinfer.generate.finish``'s). Every protocol's route."""
    from localinfer.generate.finish import plain

    if not stream:
        return engine.submit(prepared, None, channel.close), "whole"
    channel.total = len(prepared.tokens)
    news = channel.push_prompt  # the stream's head waits for the cached count; progress where asked
    if plain(None, prepared.tools) and logprobs:  # thinking stays inline in a stream of logprobs
        return engine.submit(prepared, None, channel.close, on_logprobs=channel.push_logprobs, on_prompt=news), "logprobs"
    if plain(prepared.splitter, prepared.tools):
        return engine.submit(prepared, channel.push, channel.close, on_prompt=news), "text"
    return engine.submit(prepared, None, channel.close, on_steps=channel.push_steps, on_prompt=news), "steps"


def unenforced(request: Any) -> tuple[str, ...]:
    """The tools' keywords described to the model but not enforced (request.toolcalls.enforce)."""
    return tuple(u for t in getattr(request, "tools", None) or () for u in t.unenforced)


def call_checker(request: Any, say: Callable[[str], None]) -> Callable[[Ended], None] | None:
    """Checks an answer's calls against their tools' whole schemas where the constraint left some of
    it out (request.toolcalls.enforce): a call that breaks it is said in the log. None: nothing to check."""
    tools = {t.name: t for t in getattr(request, "tools", None) or () if t.unenforced}
    if not tools:
        return None

    def check(outcome: Ended) -> None:
        from localinfer.request.toolcalls.enforce import violation

        for call in outcome.tool_calls:
            tool = tools.get(call.name)
            why = violation(tool.parameters, call.arguments) if tool is not None else None
            if why:
                say(f"tools: a call of {call.name} breaks its schema where it is not enforced: {why}")

    return check


class AnswerResponse(Response):
    """Sends one engine answer - SSE events as the text comes, or one JSON body at the end - while
    watching for the client to go away (then the request is cancelled: its sequence frees at once).

    ``writer`` makes the protocol's bytes (``serve.wires.writer.WireWriter``); ``error``: the protocol's
    error body. A Response to the routes that return it: it sends itself (``__call__``) and never
    renders a body of its own."""

    def __init__(self, ticket: Ticket, channel: Channel[Ended], writer: WireWriter, mode: str,
                 error: Callable[[ApiError], dict[str, Any]] = ApiError.body, notes: tuple[str, ...] = (),
                 on_end: Callable[[Ended], None] | None = None) -> None:  # fmt: skip
        self.ticket, self.channel, self.writer, self.mode, self.error = ticket, channel, writer, mode, error  # mode: app.submit's
        # the answer's metadata on every wire alike: what of the tools' schemas was described, not enforced
        self.notes = [(UNENFORCED_HEADER, "; ".join(notes)[:4000].encode("ascii", "backslashreplace"))] if notes else []
        self.on_end = on_end  # told the outcome before it is sent (app.call_checker)
        self.stream = mode != "whole"
        self.gone = False
        self.ended = False  # the engine's outcome arrived

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
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
        await send({"type": "http.response.start", "status": 200, "headers": [*writer.stream_headers, *self.notes]})
        offset = 0  # characters sent: the completions API's text_offset
        await self._prefill(send, writer.keepalive)
        while True:
            if self.mode == "text":  # the fast path: each piece spliced into an event made once
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
                if self.on_end is not None:
                    self.on_end(end)
                failed = end.error is not None or end.finish_reason == "interrupted"
                body += writer.stream_error(_outcome_error(end)) if failed else writer.tail(end)
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return 200
            if body:
                await send({"type": "http.response.body", "body": body, "more_body": True})

    async def _prefill(self, send: Callable, keepalive: bytes | None) -> None:
        """Until the answer's first piece: the stream's head once the request has its sequence (the
        cached count known: Anthropic's message_start reports it), or after ``KEEPALIVE_S`` without
        (queued: the best-known count); the prompt's progress where the writer sends it (llama-server's
        ``return_progress``); and the ``keepalive`` event (Anthropic's ping, else an SSE comment; None:
        none, Ollama's NDJSON) every ``KEEPALIVE_S`` of silence: clients and proxies (Codex: 300 s) see
        a live stream."""
        channel, writer, headed = self.channel, self.writer, False
        while not self.gone:
            try:
                await asyncio.wait_for(channel.event.wait(), KEEPALIVE_S)
            except asyncio.TimeoutError:
                body = (keepalive or b"") if headed else self._head(None)
                headed = True
                if body:
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                continue
            answered = channel.has_answer()
            if not answered:
                channel.event.clear()  # not for the loop below: only the prompt's news came
            news = channel.take_prompt()
            body = b"" if headed else self._head(news)
            headed = True
            if news is not None:
                body += writer.progress(channel.total, *news)
            if body:
                await send({"type": "http.response.body", "body": body, "more_body": True})
            if answered:
                return

    def _head(self, news: tuple[int, int, float] | None) -> bytes:
        """The stream's first events; ``news``: the prompt's (its cached count), None where not known yet."""
        if news is not None:
            self.writer.admitted(news[0])
        return self.writer.head(self.mode)

    async def _send_whole(self, send: Callable) -> int:
        end = None
        while end is None:
            _, end = await self.channel.get()
            if self.gone:
                return 499
        self.ended = True
        if self.on_end is not None:
            self.on_end(end)
        if end.error is not None or end.finish_reason == "interrupted":
            exc = _outcome_error(end)
            await JSONResponse(self.error(exc), status_code=exc.status, headers=exc.headers)({"type": "http"}, _no_receive, send)
            return exc.status
        body = dumps(self.writer.whole(end)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *self.notes]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return 200


def _outcome_error(end: Ended) -> ApiError:
    if end.finish_reason == "interrupted":
        return ApiError(503, "the request was cancelled: the server is shutting down", type="unavailable_error", code="cancelled")
    return ApiError(500, end.error or "the engine failed", type="server_error", code="engine_error")


async def _no_receive() -> dict[str, Any]:  # pragma: no cover - a JSONResponse never reads
    return {"type": "http.disconnect"}
