"""Anthropic's Messages API on a real `localinfer serve` (SmolLM2), driven by the official
``anthropic`` SDK: create, stream, forced tool calls whose inputs validate with ``jsonschema``, a
tool_result turn, count_tokens, errors in Anthropic's shape, what Claude Code sends, and greedy text
equal to Chat Completions' for the same messages. Assertions are on the protocol, not the answer's wisdom."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_serve_model import ServeProcess

pytestmark = pytest.mark.slow
anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

WEATHER = {"name": "get_weather", "description": "The current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                             "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                            "required": ["city", "unit"], "additionalProperties": False}}  # fmt: skip
ADD = {"name": "add", "description": "Add two integers",
       "input_schema": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 1000},
                                                         "b": {"type": "integer", "minimum": 0, "maximum": 1000}},
                        "required": ["a", "b"]}}  # fmt: skip
SCHEMAS = {t["name"]: t["input_schema"] for t in (WEATHER, ADD)}
HI = [{"role": "user", "content": "Say hello in one short sentence."}]
GREEDY = {"temperature": 0}  # sampling fields are not in the SDK's signature (Anthropic's newer models take none)


@pytest.fixture(scope="module")
def served(smollm2_path, tmp_path_factory):
    with ServeProcess(smollm2_path, "-np", "2", "-c", "1024", "-t", "1", home=tmp_path_factory.mktemp("serve-home")) as s:
        yield s


@pytest.fixture(scope="module")
def keyed(smollm2_path, tmp_path_factory):
    with ServeProcess(smollm2_path, "-np", "1", "-c", "512", "-t", "1", "--api-key", "s3cret", home=tmp_path_factory.mktemp("keyed")) as s:
        yield s


def _client(s: ServeProcess, key: str = "unused", **kw: Any) -> Any:
    return anthropic.Anthropic(base_url=s.base, api_key=key, max_retries=0, timeout=600, **kw)


def _prompt(message: Any) -> int:
    """The whole prompt: Anthropic's input_tokens counts only what was not read from the cache."""
    return message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


def _text(message: Any) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_create_answers_a_message(served):
    m = _client(served).messages.create(model="smollm2", max_tokens=16, messages=HI, extra_body=GREEDY)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"] and _text(m).strip()
    assert m.stop_reason in ("end_turn", "max_tokens") and 0 < m.usage.output_tokens <= 16 and _prompt(m) > 5
    cut = _client(served).messages.create(model="smollm2", max_tokens=2, messages=HI, extra_body=GREEDY)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2


def test_a_stop_sequence_is_named_in_the_answer_and_the_stream(served):
    # "e" ends any English sentence early; the template's own end marker is never reported as one
    kw = {"model": "smollm2", "max_tokens": 32, "messages": HI, "stop_sequences": ["e"], "extra_body": GREEDY}
    m = _client(served).messages.create(**kw)
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", "e") and "e" not in _text(m)
    with _client(served).messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "e") and _text(final) == _text(m)
    plain = _client(served).messages.create(model="smollm2", max_tokens=32, messages=HI, extra_body=GREEDY)
    assert plain.stop_sequence is None and plain.stop_reason in ("end_turn", "max_tokens")


def test_greedy_text_equals_chat_completions(served):
    ask = [{"role": "user", "content": "Name three colours."}]
    m = _client(served).messages.create(model="smollm2", max_tokens=24, messages=ask, extra_body=GREEDY, system="Be brief.")
    chat = openai.OpenAI(base_url=served.base + "/v1", api_key="x", max_retries=0).chat.completions.create(
        model="smollm2", max_tokens=24, temperature=0, messages=[{"role": "system", "content": "Be brief."}, *ask])
    assert _text(m) == chat.choices[0].message.content
    # Anthropic's input_tokens is the uncached part: with the cached part, the whole prompt
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert m.usage.output_tokens == chat.usage.completion_tokens


def test_stream_events_assemble_to_the_message(served):
    c = _client(served)
    with c.messages.stream(model="smollm2", max_tokens=20, messages=HI, extra_body=GREEDY) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    whole = c.messages.create(model="smollm2", max_tokens=20, messages=HI, extra_body=GREEDY)
    assert "".join(pieces) == _text(final) == _text(whole) and len(pieces) > 1
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    status, headers, raw = served.request("POST", "/v1/messages?beta=true",
                                          {"model": "m", "max_tokens": 4, "messages": HI, "stream": True})  # fmt: skip
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    names = [block.split("\n")[0] for block in raw.decode().split("\n\n") if block]
    assert names[:3] == ["event: message_start", "event: ping", "event: content_block_start"]
    assert names[-3:] == ["event: content_block_stop", "event: message_delta", "event: message_stop"]


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "add"}, {"type": "tool", "name": "get_weather"}])
def test_forced_tool_calls_validate(served, choice):
    ask = [{"role": "user", "content": "What is the weather in Paris, and what is 17 plus 25?"}]
    c = _client(served)
    m = c.messages.create(model="smollm2", max_tokens=96, messages=ask, tools=[WEATHER, ADD], tool_choice=choice, extra_body=GREEDY)
    calls = [b for b in m.content if b.type == "tool_use"]
    assert calls and m.stop_reason == "tool_use", m
    for call in calls:
        jsonschema.validate(call.input, SCHEMAS[call.name])
        assert call.name == choice.get("name", call.name) and call.id
    with c.messages.stream(model="smollm2", max_tokens=96, messages=ask, tools=[WEATHER, ADD], tool_choice=choice,
                           extra_body=GREEDY) as stream:  # fmt: skip
        final = stream.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in streamed] == [(b.name, b.input) for b in calls] and final.stop_reason == "tool_use"


def test_a_tool_result_turn_is_answered(served):
    c = _client(served)
    ask = {"role": "user", "content": "What is 17 plus 25?"}
    m = c.messages.create(model="smollm2", max_tokens=64, messages=[ask], tools=[ADD], tool_choice={"type": "tool", "name": "add"})
    (call,) = [b for b in m.content if b.type == "tool_use"][:1]
    turns = [ask, {"role": "assistant", "content": [b.model_dump() for b in m.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "42"}]}]  # fmt: skip
    answer = c.messages.create(model="smollm2", max_tokens=24, messages=turns, tools=[ADD], extra_body=GREEDY)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use") and _prompt(answer) > _prompt(m)
    with pytest.raises(anthropic.BadRequestError, match="tool_call_id|tool_use"):  # a result for no call
        c.messages.create(model="smollm2", max_tokens=8, messages=[ask, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_nope", "content": "42"}]}])  # fmt: skip


def test_count_tokens_equals_the_usage(served):
    c = _client(served)
    kw: dict[str, Any] = {"model": "smollm2", "system": "Be brief.", "messages": HI, "tools": [WEATHER]}
    counted = c.messages.count_tokens(**kw)
    m = c.messages.create(max_tokens=4, **kw)
    assert counted.input_tokens == _prompt(m) > 10


def test_what_claude_code_sends_is_accepted(served):
    """System blocks with cache_control, a system-role turn, adaptive thinking, context_management,
    output_config, metadata, a long anthropic-beta header, and max_tokens far beyond the context (clamped)."""
    c = _client(served, default_headers={"anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"})
    m = c.messages.create(
        model="claude-sonnet-4-5", max_tokens=32000,
        system=[{"type": "text", "text": "You are a CLI.", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "Be brief."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}],
        metadata={"user_id": "u1"},
        extra_body={"temperature": 0, "thinking": {"type": "adaptive"}, "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
                    "output_config": {"effort": "high"}},
    )  # fmt: skip
    assert m.type == "message" and m.stop_reason in ("end_turn", "max_tokens")
    status, body = served.json("POST", "/v1/messages", {"model": "m", "max_tokens": 8, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]})  # fmt: skip
    assert status == 200 and body["content"][0]["type"] == "text"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"messages": HI}, "max_tokens"),
        ({"max_tokens": 8, "messages": HI, "temperature": "hot"}, "temperature"),
        ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
        ({"max_tokens": 8, "messages": HI, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"max_tokens": 8, "messages": HI, "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
        ({"max_tokens": 8, "messages": HI, "frobnicate": 1}, "frobnicate"),
    ],
)
def test_bad_requests_are_anthropic_errors_and_the_server_serves_on(served, body, needle):
    status, got = served.json("POST", "/v1/messages", {"model": "m", **body})
    assert status == 400 and got["type"] == "error" and got["error"]["type"] == "invalid_request_error"
    assert needle in got["error"]["message"]
    assert served.json("POST", "/v1/messages", {"model": "m", "max_tokens": 2, "messages": HI})[0] == 200


def test_the_key_by_x_api_key_or_bearer(keyed):
    m = _client(keyed, key="s3cret").messages.create(model="m", max_tokens=2, messages=HI)  # x-api-key
    assert m.usage.output_tokens == 2
    bearer = anthropic.Anthropic(base_url=keyed.base, auth_token="s3cret", max_retries=0)
    assert bearer.messages.create(model="m", max_tokens=2, messages=HI).usage.output_tokens == 2
    with pytest.raises(anthropic.AuthenticationError) as info:
        _client(keyed, key="wrong").messages.create(model="m", max_tokens=2, messages=HI)
    assert info.value.body["error"]["type"] == "authentication_error"
    text = keyed.request("GET", "/metrics", headers={"Authorization": "Bearer s3cret"})[2].decode()
    assert 'endpoint="messages",status="200"' in text and 'endpoint="messages",status="401"' in text
    assert json.loads(keyed.request("POST", "/v1/messages/count_tokens", {"messages": HI}, headers={"x-api-key": "s3cret"})[2])["input_tokens"] > 0
