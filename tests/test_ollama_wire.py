"""Ollama's wire shapes without a model: its requests as the core's, and answers (thinking, calls,
counters) as Ollama's objects. The real server and clients are tests/test_serve_ollama.py's."""

from __future__ import annotations

import json

import pytest

from localinfer.engine.types import GenerationStats
from localinfer.generate.finish import CallArgs, CallStart, Text, Thought
from localinfer.serve.wires.ollama import chat as wire
from localinfer.serve.scheduler.worker import Ended
from localinfer.serve.wires.openai import ApiError
from localinfer.request.toolcalls.spec import ToolCall

HI = [{"role": "user", "content": "hi"}]


def test_options_format_and_think_become_the_core_request():
    body = {"messages": HI, "stream": False, "think": "high", "format": {"type": "object"},
            "options": {"temperature": 0.2, "top_k": 5, "seed": -1, "num_predict": -1, "stop": ["x"], "num_ctx": 99999, "mirostat": 2}}  # fmt: skip
    asked = wire.parse_chat(body, "m")
    req = asked.request
    assert req is not None and req.kind == "chat" and not req.stream and asked.think == "high"
    q = req.request  # the core request; streaming and where the format was asked are the wire's
    assert q.sampling.temperature == 0.2 and q.sampling.top_k == 5 and q.sampling.seed is None
    assert q.max_tokens is None and q.stop == ("x",) and req.format_field == "format" and q.response_format is not None
    assert q.chat_template_kwargs == {"enable_thinking": True, "reasoning_effort": "high"}
    assert wire.parse_chat({"messages": HI}, "m").request.stream  # Ollama streams by default
    assert wire.parse_chat({"messages": []}, "m").request is None  # "load the model"


def test_generate_is_a_chat_turn_or_the_raw_prompt():
    templated = wire.parse_generate({"prompt": "p", "system": "s"}, "m", templated=True).request
    assert templated.kind == "chat" and [m["role"] for m in templated.request.messages] == ["system", "user"]
    raw = wire.parse_generate({"prompt": "p", "system": "s", "raw": True}, "m", templated=True).request
    assert raw.kind == "text" and raw.request.raw_text == "p"
    assert wire.parse_generate({"prompt": "p"}, "m", templated=False).request.kind == "text"
    assert wire.parse_generate({"prompt": ""}, "m", templated=True).request is None


def test_past_calls_and_their_results_are_tied_by_name():
    msgs = [*HI, {"role": "assistant", "content": "", "thinking": "hmm", "tool_calls": [
        {"function": {"name": "a", "arguments": {"x": 1}}}, {"function": {"name": "b", "arguments": {}}}]},
        {"role": "tool", "tool_name": "b", "content": "B"}, {"role": "tool", "content": "A"}]  # fmt: skip
    core = wire.chat_messages(msgs)
    calls = core[1]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == [{"x": 1}, {}] and core[1]["reasoning_content"] == "hmm"
    assert core[2]["tool_call_id"] == calls[1]["id"] and core[3]["tool_call_id"] == calls[0]["id"]


@pytest.mark.parametrize(
    ("body", "field"),
    [({"messages": HI, "options": {"top_p": 3}}, "options.top_p"), ({"messages": HI, "think": "max"}, "think"),
     ({"messages": HI, "format": 3}, "format"), ({"messages": [{"role": "user", "content": "x", "images": ["a"]}]}, "messages[0].images"),
     ({"messages": HI, "tools": [{"type": "function"}]}, "tools[0]"), ({"messages": HI, "stream": "yes"}, "stream")],
)  # fmt: skip
def test_bad_fields_are_named(body, field):
    with pytest.raises(ApiError) as err:
        wire.parse_chat(body, "m")
    assert err.value.status == 400 and field in err.value.message
    assert wire.error_body(err.value) == {"error": err.value.message}


def _outcome(**kw) -> Ended:
    stats = GenerationStats(prompt_tokens=10, cached_tokens=4, completion_tokens=5, prefill_s=0.25, decode_s=0.5)
    return Ended(kw.pop("text", "hello"), "stop", stats, queue_s=0.0, ttft_s=0.3, total_s=1.0, **kw)


def test_the_answer_whole_with_thinking_calls_and_counters():
    call = ToolCall("call_1", "get", '{"city": "Paris"}')
    whole = wire.OllamaAnswer("chat", "m").whole(_outcome(reasoning="think", tool_calls=(call, ToolCall("c2", "cut", '{"a'))))
    assert whole["message"] == {"role": "assistant", "content": "hello", "thinking": "think",
                                "tool_calls": [{"id": "call_1", "function": {"index": 0, "name": "get", "arguments": {"city": "Paris"}}}]}  # fmt: skip
    assert whole["done"] and whole["done_reason"] == "stop"
    assert (whole["total_duration"], whole["prompt_eval_count"], whole["prompt_eval_duration"], whole["eval_count"],
            whole["eval_duration"], whole["load_duration"]) == (1_000_000_000, 10, 250_000_000, 5, 500_000_000, 0)  # fmt: skip
    gen = wire.OllamaAnswer("generate", "m").whole(_outcome(reasoning="think"))
    assert gen["response"] == "hello" and gen["thinking"] == "think" and "message" not in gen


def test_the_stream_steps_text_and_last_object():
    answer = wire.OllamaAnswer("chat", "m")
    lines = [json.loads(x) for x in answer.steps([Thought("t"), Text("a"), CallStart(0, "call_1", "get"), CallArgs(0, "{}")]).splitlines()]
    assert [x["message"] for x in lines] == [{"role": "assistant", "content": "", "thinking": "t"}, {"role": "assistant", "content": "a"}]
    assert json.loads(answer.text_piece(b'"b\\n"'))["message"]["content"] == "b\n"
    tail = [json.loads(x) for x in answer.tail(_outcome(tool_calls=(ToolCall("call_1", "get", "{}"),))).splitlines()]
    assert tail[0]["message"]["tool_calls"][0]["function"]["arguments"] == {} and not tail[0]["done"]
    assert tail[1]["done"] and tail[1]["message"]["content"] == "" and tail[1]["eval_count"] == 5
    assert json.loads(answer.stream_error(ApiError(500, "boom"))) == {"error": "boom"}
