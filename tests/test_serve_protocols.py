"""The Anthropic and Responses translators without a model: how their requests map to serve's request,
and how a scripted engine's answer comes out on their wires (the real clients: test_serve_anthropic.py,
test_serve_responses.py)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

pytest.importorskip("starlette")

from test_serve import FakeEngine, _outcome, _state, call  # noqa: E402

from localinfer.serve.wires import anthropic

from localinfer.serve.wires import responses as responses_api  # noqa: E402
from localinfer.serve.wires.openai import ApiError  # noqa: E402

HI = [{"role": "user", "content": "hi"}]


class Slow(FakeEngine):
    """Answers after ``delay`` seconds (a long prefill); takes the clamp the Anthropic route asks for."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.delay = delay

    def prepare(self, request: Any, clamp: bool = False) -> Any:
        self.clamped = clamp
        return super().prepare(request)

    def submit(self, prepared: Any, on_text: Any, on_end: Any, **_: Any) -> Any:
        def run() -> None:
            time.sleep(self.delay)
            for p in self.pieces:
                if on_text:
                    on_text(p)
            on_end(_outcome("".join(self.pieces), "stop"))

        threading.Thread(target=run).start()
        return self


def test_anthropic_turns_become_the_one_request():
    body = {"max_tokens": 9, "system": [{"type": "text", "text": "A.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "system", "content": "B."}, {"role": "user", "content": "q"},
                         {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                                           {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "2"}]},
                                                      {"type": "text", "text": "and?"}]}],
            "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "stop_sequences": ["\n\n"],
            "thinking": {"type": "disabled"}, "metadata": {"user_id": "u"}, "context_management": {}}  # fmt: skip
    r = anthropic.parse(body).request
    roles = [m["role"] for m in r.messages]
    assert roles == ["system", "user", "assistant", "tool", "user"] and r.messages[0]["content"] == "A.\n\nB."
    assert r.messages[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": {"x": 1}}
    assert r.messages[3]["tool_call_id"] == "t1" and r.messages[3]["content"] == "2"
    assert r.tool_choice.mode == "required" and not r.parallel_tool_calls and r.stop == ("\n\n",)
    assert r.chat_template_kwargs == {"enable_thinking": False} and r.max_tokens == 9


def test_responses_input_becomes_the_one_request():
    body = {"instructions": "Be brief.", "max_output_tokens": 5, "store": False, "include": ["reasoning.encrypted_content"],
            "input": [{"type": "message", "role": "user", "id": "m", "content": [{"type": "input_text", "text": "q"}]},
                      {"type": "reasoning", "summary": []},
                      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\":1}"},
                      {"type": "function_call_output", "call_id": "c1", "output": "2"}],
            "tools": [{"type": "web_search"}, {"type": "namespace", "name": "n"},
                      {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}],
            "text": {"format": {"type": "json_schema", "name": "o", "schema": {"type": "object"}, "strict": True}},
            "tool_choice": "none"}  # fmt: skip
    r = responses_api.parse(body).request
    assert [m["role"] for m in r.messages] == ["system", "user", "assistant", "tool"] and r.max_tokens == 5
    assert [t.name for t in r.tools] == ["f"] and r.response_format.kind == "json_schema"
    with pytest.raises(ApiError, match="together with 'tools'") as info:  # both cannot hold one answer
        responses_api.parse({**body, "tool_choice": "auto"})
    assert info.value.status == 400 and info.value.param == "text.format"
    with pytest.raises(ApiError, match="stateless") as info:
        responses_api.parse({"input": "x", "previous_response_id": "resp_1"})
    assert info.value.param == "previous_response_id"


def test_a_long_prefill_streams_anthropic_pings_then_the_answer(monkeypatch):
    from localinfer.serve.http import sending
    monkeypatch.setattr(sending, "KEEPALIVE_S", 0.05)
    engine = Slow(delay=0.5)
    status, _, body = call(_state(engine), "POST", "/v1/messages", {"max_tokens": 50000, "messages": HI, "stream": True})
    names = [b.split("\n")[0][len("event: "):] for b in body.decode().split("\n\n") if b]
    assert status == 200 and engine.clamped and names.count("ping") > 2
    assert names[0] == "message_start" and names[-1] == "message_stop"
    text = "".join(json.loads(b.split("\n")[1][6:])["delta"].get("text", "") for b in body.decode().split("\n\n")
                   if b.startswith("event: content_block_delta"))  # fmt: skip
    assert text == "Hello"


def test_the_responses_stream_numbers_every_event():
    status, _, body = call(_state(Slow()), "POST", "/v1/responses", {"input": "hi", "stream": True})
    events = [json.loads(b.split("\n")[1][6:]) for b in body.decode().split("\n\n") if b]
    assert status == 200 and [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed" and events[-1]["response"]["output"][0]["content"][0]["text"] == "Hello"
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Hello"


def test_tools_with_a_format_are_refused_on_every_wire_naming_the_format():
    from localinfer.serve.wires.ollama import chat as ollama_wire
    tool = {"name": "f", "input_schema": {"type": "object"}}
    schema = {"type": "object"}
    with pytest.raises(ApiError, match="together with 'tools'") as info:
        anthropic.parse({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "q"}], "tools": [tool],
                         "output_config": {"format": {"type": "json_schema", "schema": schema}}})  # fmt: skip
    assert info.value.status == 400 and info.value.param == "output_config.format"
    ollama_tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    with pytest.raises(ApiError, match="together with 'tools'") as info:
        ollama_wire.parse_chat({"messages": [{"role": "user", "content": "q"}], "tools": [ollama_tool], "format": schema}, "m")
    assert info.value.status == 400 and info.value.param == "format"


class Admitting(FakeEngine):
    """Tells the prompt's news as the engine does (admission with ``cached`` reused, then a prefill
    of ``hold`` seconds in ``chunks``) before it answers; the outcome's usage says the same."""

    def __init__(self, cached: int = 4, hold: float = 0.0, chunks: int = 1) -> None:
        super().__init__()
        self.cached, self.hold, self.chunks = cached, hold, chunks

    def prepare(self, request: Any, clamp: bool = False) -> Any:
        from localinfer.serve.scheduler.worker import Prepared

        return Prepared(request, list(range(10)), ())

    def submit(self, prepared: Any, on_text: Any, on_end: Any, on_prompt: Any = None, on_steps: Any = None, **_: Any) -> Any:
        def run() -> None:
            if on_prompt is not None:
                on_prompt(self.cached, self.cached)
                for i in range(1, self.chunks + 1):
                    time.sleep(self.hold / self.chunks)
                    on_prompt(self.cached, self.cached + (10 - self.cached) * i // self.chunks)
            for p in self.pieces:
                if on_text:
                    on_text(p)
                elif on_steps:
                    from localinfer.generate.finish import Text

                    on_steps([Text(p)])
            on_end(_outcome("".join(self.pieces), "stop"))  # prompt_tokens=10, cached_tokens=4

        threading.Thread(target=run).start()
        return self


def _events(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for b in body.decode().split("\n\n") for line in b.split("\n") if line.startswith("data: {")]


def test_anthropic_usage_counts_the_cached_part_apart_in_the_stream_and_the_message():
    # input_tokens is the uncached part: the 21,320-token prompt cached but one token said 21320 + 21319
    body = {"max_tokens": 8, "messages": HI}
    status, _, raw = call(_state(Admitting(cached=4)), "POST", "/v1/messages", {**body, "stream": True})
    events = _events(raw)
    start = events[0]["message"]["usage"]
    assert status == 200 and start == {"input_tokens": 6, "cache_read_input_tokens": 4, "output_tokens": 0}
    (delta,) = [e for e in events if e["type"] == "message_delta"]
    assert delta["usage"] == {"input_tokens": 6, "cache_read_input_tokens": 4, "output_tokens": 3}
    status, _, raw = call(_state(Admitting(cached=4)), "POST", "/v1/messages", body)
    assert status == 200 and json.loads(raw)["usage"] == {"input_tokens": 6, "cache_read_input_tokens": 4, "output_tokens": 3}


def _asgi(engine: Any) -> Any:
    """An httpx transport into the app on ``engine``: the official clients read what it streams."""
    import asyncio

    import httpx

    from localinfer.serve.http.app import create_app
    from localinfer.serve.scheduler.bridge import Hub

    state = _state(engine)

    class Transport(httpx.ASGITransport):
        async def handle_async_request(self, request: Any) -> Any:
            state.hub = Hub(asyncio.get_running_loop())
            return await super().handle_async_request(request)

    return httpx.AsyncClient(transport=Transport(app=create_app(state)), base_url="http://127.0.0.1")


def test_a_long_prefill_keeps_openai_and_responses_streams_alive_and_their_clients_read_through(monkeypatch):
    import asyncio

    openai = pytest.importorskip("openai")
    from localinfer.serve.http import sending
    monkeypatch.setattr(sending, "KEEPALIVE_S", 0.05)
    for path, body in (("/v1/chat/completions", {"messages": HI}), ("/v1/completions", {"prompt": "x"}),
                       ("/v1/responses", {"input": "hi"})):  # fmt: skip
        status, _, raw = call(_state(Admitting(hold=0.5)), "POST", path, {**body, "stream": True})
        head, _, rest = raw.partition(b": keep-alive\n\n")  # the head first (the request has its sequence), then comments
        assert status == 200 and raw.count(b": keep-alive\n\n") > 2 and b"prompt_progress" not in raw, path
        opens = {"/v1/chat/completions": b"data: {", "/v1/completions": b"", "/v1/responses": b"event: response.created"}
        assert head.startswith(opens[path]) and b"Hel" in rest and b"Hel" not in head, path

    async def main() -> tuple[str, str]:
        client = openai.AsyncOpenAI(base_url="http://127.0.0.1/v1", api_key="x", max_retries=0, http_client=_asgi(Admitting(hold=0.5)))
        chunks = [c async for c in await client.chat.completions.create(model="m", messages=HI, stream=True)]
        client = openai.AsyncOpenAI(base_url="http://127.0.0.1/v1", api_key="x", max_retries=0, http_client=_asgi(Admitting(hold=0.5)))
        events = [e async for e in await client.responses.create(model="m", input="hi", stream=True)]
        assert events[-1].type == "response.completed"
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), events[-1].response.output_text

    assert asyncio.run(main()) == ("Hello", "Hello")  # the comments skipped, as the SSE spec says


def test_return_progress_streams_llama_servers_prompt_progress_chunks(monkeypatch):
    import asyncio

    openai = pytest.importorskip("openai")

    async def main() -> list[Any]:
        client = openai.AsyncOpenAI(base_url="http://127.0.0.1/v1", api_key="x", max_retries=0,
                                    http_client=_asgi(Admitting(cached=4, hold=0.2, chunks=2)))  # fmt: skip
        stream = await client.chat.completions.create(model="m", messages=HI, stream=True, stream_options={"include_usage": True},
                                                      extra_body={"return_progress": True})  # fmt: skip
        return [c async for c in stream]

    chunks = asyncio.run(main())
    progress = [c.model_extra["prompt_progress"] for c in chunks if (c.model_extra or {}).get("prompt_progress")]
    # llama-server's shape: total, cache, processed (cached ones included), time_ms; at admission, then per decode
    assert [(p["total"], p["cache"], p["processed"]) for p in progress] == [(10, 4, 4), (10, 4, 7), (10, 4, 10)]
    assert all(p["time_ms"] >= 0 for p in progress) and progress[-1]["time_ms"] >= 150
    first = next(c for c in chunks if (c.model_extra or {}).get("prompt_progress"))
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content is None
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello"
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 4
    status, _, raw = call(_state(Admitting(cached=4, hold=0.2)), "POST", "/v1/completions",
                          {"prompt": "x", "stream": True, "return_progress": True})  # fmt: skip
    assert status == 200 and raw.count(b'"prompt_progress":{"total":10,"cache":4,"processed":') == 2
    status, _, raw = call(_state(Admitting()), "POST", "/v1/chat/completions", {"messages": HI, "return_progress": True})
    assert status == 200 and b"prompt_progress" not in raw  # a whole answer: nothing to show progress in


def test_ollamas_ndjson_stream_gets_no_keep_alive_line(monkeypatch):
    import asyncio

    from localinfer.serve.wires.ollama import chat as ollama_wire

    from localinfer.serve.http import sending
    from localinfer.serve.scheduler.bridge import Channel, Hub

    monkeypatch.setattr(sending, "KEEPALIVE_S", 0.05)

    async def main() -> bytes:
        channel: Channel[Any] = Channel(Hub(asyncio.get_running_loop()))
        ticket = Admitting(hold=0.3).submit(None, channel.push, channel.close, on_prompt=channel.push_prompt)
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()  # the client stays
            return {}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await sending.AnswerResponse(ticket, channel, ollama_wire.OllamaAnswer("chat", "m", 0.0), "text")({"type": "http"}, receive, send)
        return b"".join(m.get("body", b"") for m in sent[1:])

    lines = asyncio.run(main()).decode().splitlines()  # every line an object: Ollama's clients parse each
    assert len(lines) >= 2 and all(json.loads(line) for line in lines) and json.loads(lines[-1])["done"] is True
