"""Streaming completions from an OpenAI-compatible server, measured on the client.

One :class:`StreamState` reads a stream's lines and keeps the clock: TTFT (request sent -> first
chunk with text), the gaps between text chunks (ITL), the end. Token counts come only from the
server (``usage``, asked for with ``stream_options.include_usage``; llama-server's ``timings``);
a count the server does not give stays None. :class:`Client` (sync: run, chat, batch) and
:func:`astream` (async: the load test) share it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from localinfer.request import defaults as llama_defaults
from localinfer.errors import Interrupted
from localinfer.remote.connection import (
    Endpoint,
    ProtocolError,
    RemoteError,
    status_error,
    transport_error,
)
from localinfer.answer.answer import Received  # what the client returns, re-exported
from localinfer.remote.sse import SSEDecoder, choice_logprobs, choice_text, parse_event

if TYPE_CHECKING:
    from localinfer.request.sampling import SamplingOptions

OnText = Callable[[str], None]


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class StreamState:
    """Lines of one SSE response in, an :class:`Received` out."""

    def __init__(self, where: str, t_start: float, on_text: OnText | None = None, on_reasoning: OnText | None = None) -> None:
        self.where, self.on_text, self.on_reasoning = where, on_text, on_reasoning
        self.outcome = Received(t_start=t_start)
        self.decoder = SSEDecoder()
        self.done = False
        self._pieces: list[str] = []
        self._logprobs: list[dict[str, Any]] | None = None

    def line(self, line: str, now: float) -> None:
        event = self.decoder.feed(line)
        if event is None or self.done:
            return
        chunk = parse_event(event[0], event[1], self.where)
        if chunk is None:
            self.done = True
            return
        self.chunk(chunk, now)

    def chunk(self, chunk: dict[str, Any], now: float) -> None:
        o = self.outcome
        o.model = o.model or (chunk.get("model") if isinstance(chunk.get("model"), str) else None)
        for choice in chunk.get("choices") or ():
            thought = _reasoning_of(choice)
            if thought:
                o.reasoning += thought
                if self.on_reasoning is not None:
                    self.on_reasoning(thought)
            text = choice_text(choice, self.where)
            if text:
                if o.t_first is None:
                    o.t_first = now
                elif o.t_last is not None:
                    o.itl.append(now - o.t_last)
                o.t_last = now
                o.chunks += 1
                self._pieces.append(text)
                if self.on_text is not None:
                    self.on_text(text)
            entries = choice_logprobs(choice)
            if entries is not None:
                self._logprobs = (self._logprobs or []) + entries
            if choice.get("finish_reason"):
                o.finish_reason = str(choice["finish_reason"])
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            o.prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
            o.completion_tokens = _int_or_none(usage.get("completion_tokens"))
            o.image_tokens = _int_or_none(usage.get("image_tokens"))  # our serve's: of prompt_tokens
            out_details = usage.get("completion_tokens_details")
            if isinstance(out_details, dict):
                o.reasoning_tokens = _int_or_none(out_details.get("reasoning_tokens"))
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and _int_or_none(details.get("cached_tokens")) is not None:
                o.cached_tokens = details["cached_tokens"]
        if isinstance(chunk.get("timings"), dict):
            o.server_timings = chunk["timings"]
        if isinstance(chunk.get("localinfer"), dict):  # our resident server's: the answer whole
            o.whole = chunk["localinfer"]

    def whole(self, body: dict[str, Any], now: float) -> None:
        """A server that answered the stream request with one JSON completion: take it as one chunk."""
        choices = body.get("choices")
        if not isinstance(choices, list):
            raise ProtocolError(f"{self.where} answered without 'choices'")
        for c in choices:
            if isinstance(c, dict) and isinstance(c.get("message"), dict):
                c["delta"] = c["message"]
        self.chunk(body, now)
        self.done = True

    def interrupted(self, now: float) -> Received:
        """What was received before Ctrl-C, finish reason ``interrupted``."""
        o = self.outcome
        o.t_end, o.text, o.finish_reason = now, "".join(self._pieces), "interrupted"
        o.logprobs = self._logprobs
        return o

    def finish(self, now: float) -> Received:
        """The outcome; an answer cut short (no [DONE], no finish reason) is an error."""
        o = self.outcome
        o.t_end = now
        o.text = "".join(self._pieces)
        o.logprobs = self._logprobs
        if not self.done and o.finish_reason is None:
            what = "in the middle of an event" if self.decoder.pending() else "before the answer ended"
            raise RemoteError(f"{self.where} closed the stream {what}", retryable=True,
                              hint="the server stopped or died; see its log")  # fmt: skip
        if o.cached_tokens is None and o.server_timings and _int_or_none(o.server_timings.get("cache_n")) is not None:
            o.cached_tokens = o.server_timings["cache_n"]
        return o


def _reasoning_of(choice: dict[str, Any]) -> str:
    """A reasoning model's thinking in a chunk: ``reasoning_content`` (llama-server, DeepSeek, our
    serve) or ``reasoning`` (Ollama, newer vLLM)."""
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return ""
    for key in ("reasoning_content", "reasoning"):
        if isinstance(delta.get(key), str):
            return delta[key]
    return ""


# -- requests ---------------------------------------------------------------------------------------


def request_body(
    model: str,
    *,
    messages: Iterable[dict[str, Any]] | None = None,
    prompt: str | None = None,
    sampling: SamplingOptions | None = None,
    max_tokens: int | None = None,
    stop: Iterable[str] = (),
    ignore_eos: bool = False,
    chat_template_kwargs: dict[str, Any] | None = None,
    reasoning_format: str | None = None,
    logprobs: int | None = None,
) -> dict[str, Any]:
    """A streaming chat (``messages``) or completion (``prompt``) request; ``logprobs`` (the top N)
    as the API asks it: chat's ``logprobs: true`` + ``top_logprobs``, the completions' ``logprobs: N``.

    Only OpenAI's own fields unless asked: top_k, min_p, repeat_penalty and repeat_last_n are sent
    when they differ from llama.cpp's defaults (which llama.cpp-based servers already use, and which
    OpenAI's API would refuse as unknown), ``ignore_eos`` when set.
    """
    body: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True}}
    if messages is not None:
        body["messages"] = [{"role": m["role"], "content": m["content"]} for m in messages]
    else:
        body["prompt"] = prompt or ""
    if sampling is not None:
        body["temperature"] = sampling.temperature
        body["top_p"] = sampling.top_p
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        for key in ("top_k", "min_p", "repeat_penalty", "repeat_last_n"):
            if getattr(sampling, key) != getattr(llama_defaults, key):
                body[key] = getattr(sampling, key)
        for key in ("presence_penalty", "frequency_penalty"):  # OpenAI's, off at 0 (a batch line sets them)
            if getattr(sampling, key):
                body[key] = getattr(sampling, key)
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    stop = list(stop)
    if stop:
        body["stop"] = stop
    if ignore_eos:
        body["ignore_eos"] = True
    if chat_template_kwargs and messages is not None:  # vLLM's and llama-server's field
        body["chat_template_kwargs"] = chat_template_kwargs
    if reasoning_format is not None and messages is not None:  # llama-server's
        body["reasoning_format"] = reasoning_format
    if logprobs is not None:
        body.update({"logprobs": True, "top_logprobs": logprobs} if messages is not None else {"logprobs": logprobs})
    return body


def _path(body: dict[str, Any]) -> str:
    return "chat/completions" if "messages" in body else "completions"


def _is_json(response: Any) -> bool:
    return response.headers.get("content-type", "").split(";")[0].strip() == "application/json"


class Client:
    """A connection pool to one endpoint (httpx.Client); thread-safe, as httpx's is."""

    def __init__(self, ep: Endpoint, *, pool: int = 10) -> None:
        from localinfer.remote.connection import httpx

        h = httpx()
        self.ep = ep
        self._http = h.Client(timeout=ep.timeout(), headers=ep.headers(),
                              limits=h.Limits(max_connections=max(pool, 1), max_keepalive_connections=max(pool, 1)))  # fmt: skip

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def models(self) -> list[str]:
        """The model ids of ``/v1/models``, in the server's order."""
        try:
            r = self._http.get(self.ep.url("models"))
        except Exception as exc:  # httpx's errors share no base with ours
            raise _translate(exc, self.ep, started=False) from None
        if r.status_code != 200:
            raise status_error(r.status_code, r.content, r.headers, self.ep, "the model list")
        try:
            data = r.json().get("data")
            return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
        except (ValueError, AttributeError, TypeError):
            raise ProtocolError(f"{self.ep.display}/models is not an OpenAI model list",
                                hint="--endpoint is the OpenAI base URL, e.g. http://host:8080/v1") from None  # fmt: skip

    def pick_model(self, name: str | None) -> str:
        """``-m`` as given, or the server's first model (``/v1/models``)."""
        if name:
            return name
        ids = self.models()
        if not ids:
            raise RemoteError(f"{self.ep.display} serves no model (its /models list is empty)", fatal=True)
        return ids[0]

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One JSON request, one JSON object back (``embeddings``); an error answer raises."""
        try:
            r = self._http.post(self.ep.url(path), json=body)
            data = r.json() if r.status_code == 200 else None
        except Exception as exc:  # httpx's errors share no base with ours
            raise (_translate(exc, self.ep, started=True) or exc) from None
        if r.status_code != 200:
            raise status_error(r.status_code, r.content, r.headers, self.ep)
        if not isinstance(data, dict):
            raise ProtocolError(f"{self.ep.display}/{path} answered {type(data).__name__}, not a JSON object")
        return data

    def stream(self, body: dict[str, Any], on_text: OnText | None = None, on_reasoning: OnText | None = None) -> Received:
        """Send one streaming request; ``on_text`` gets each piece of text as it comes (``on_reasoning``
        a reasoning model's thinking, where the server sends it apart)."""
        t0 = time.perf_counter()
        state = StreamState(self.ep.display, t0, on_text, on_reasoning)
        started = False
        try:
            with self._http.stream("POST", self.ep.url(_path(body)), json=body) as r:
                if r.status_code != 200:
                    r.read()
                    raise status_error(r.status_code, r.content, r.headers, self.ep)
                started = True
                if _is_json(r):
                    r.read()
                    state.whole(r.json(), time.perf_counter())
                else:
                    for line in r.iter_lines():  # read to the end (not just [DONE]): the connection is reused
                        state.line(line, time.perf_counter())
        except KeyboardInterrupt as exc:
            raise Interrupted(state.interrupted(time.perf_counter())) from exc
        except RemoteError:
            raise
        except Exception as exc:  # httpx's errors share no base with ours
            translated = _translate(exc, self.ep, started=started)
            if translated is None:
                raise
            raise translated from None
        return state.finish(time.perf_counter())


def _translate(exc: BaseException, ep: Endpoint, *, started: bool) -> Exception | None:
    from localinfer.errors import LocalInferError
    from localinfer.remote.connection import httpx

    if isinstance(exc, LocalInferError):
        return exc
    if isinstance(exc, httpx().HTTPError):
        return transport_error(exc, ep, started=started)
    if isinstance(exc, (ValueError, UnicodeDecodeError)):  # a JSON body that is not JSON
        return ProtocolError(f"{ep.display} sent a body that is not JSON: {exc}")
    return None


async def astream(http: Any, ep: Endpoint, body: dict[str, Any]) -> Received:
    """The async twin of :meth:`Client.stream` (``http``: an httpx.AsyncClient), for the load test."""
    t0 = time.perf_counter()
    state = StreamState(ep.display, t0)
    started = False
    try:
        async with http.stream("POST", ep.url(_path(body)), json=body) as r:
            if r.status_code != 200:
                await r.aread()
                raise status_error(r.status_code, r.content, r.headers, ep)
            started = True
            if _is_json(r):
                await r.aread()
                state.whole(r.json(), time.perf_counter())
            else:
                async for line in r.aiter_lines():  # read to the end (not just [DONE]): the connection is reused
                    state.line(line, time.perf_counter())
    except RemoteError:
        raise
    except Exception as exc:  # httpx's errors share no base with ours
        translated = _translate(exc, ep, started=started)
        if translated is None:
            raise
        raise translated from None
    return state.finish(time.perf_counter())
