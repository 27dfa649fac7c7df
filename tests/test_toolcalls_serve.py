"""Tool calls through a real `localinfer serve`, driven by the official ``openai`` client, with a
template that knows tools (Qwen2.5-7B-Instruct's real one, from the llama-cpp-python sdist's
vendored llama.cpp, written into SmolLM2's GGUF: the Hermes format) and with SmolLM2's own chatml,
which knows none (the generic JSON format). ``required`` and named calls always validate against
``parameters`` (jsonschema), streamed deltas assemble to the calls of the same answer unstreamed,
``none`` gives text, a tool-result turn answers, and bad input is a 400 after which the server serves."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ggufmutate import T_STRING, read_layout, write_layout
from templatesource import real_template
from test_serve_model import ServeProcess

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}  # fmt: skip
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 1000},
                                                    "b": {"type": "integer", "minimum": 0, "maximum": 1000}},
                   "required": ["a", "b"]}}}  # fmt: skip
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASKS = ["What is the weather like in Paris?", "Add 17 and 25.", "Hello! Who are you?"]
GREEDY = {"temperature": 0, "max_tokens": 96}


@pytest.fixture(scope="module", params=["qwen2.5", "chatml"])
def served(request, smollm2_path, tmp_path_factory):
    """SmolLM2 with Qwen2.5's real template (Hermes calls), or with its own chatml (generic)."""
    model = smollm2_path
    if request.param == "qwen2.5":
        layout = read_layout(smollm2_path)
        layout.set_scalar("tokenizer.chat_template", T_STRING, real_template("Qwen-Qwen2.5-7B-Instruct"))
        model = write_layout(layout, tmp_path_factory.mktemp("qwen-template") / "smollm2-qwen25-template.gguf")
    with ServeProcess(model, "-np", "2", "-c", "2048", home=tmp_path_factory.mktemp("serve-home")) as s:
        yield request.param, s


def _client(s: ServeProcess) -> Any:
    return openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=300)


def _ask(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def _valid_calls(message: Any, names: set[str]) -> list[tuple[str, dict]]:
    assert message.tool_calls, message
    out = []
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        out.append((call.function.name, args))
    return out


def test_required_and_named_calls_always_validate(served):
    kind, s = served
    c = _client(s)
    named = {name: {"type": "function", "function": {"name": name}} for name in SCHEMAS}
    # a question no tool answers too: a forced choice calls anyway
    for ask, choice, names in [(ASKS[0], "required", set(SCHEMAS)), (ASKS[2], "required", set(SCHEMAS)),
                               (ASKS[1], named["add"], {"add"}), (ASKS[2], named["get_weather"], {"get_weather"})]:  # fmt: skip
        r = c.chat.completions.create(model="m", messages=_ask(ask), tools=TOOLS, tool_choice=choice, **GREEDY)
        choice0 = r.choices[0]
        assert choice0.finish_reason == "tool_calls", (kind, ask, choice, choice0)
        assert choice0.message.content is None
        _valid_calls(choice0.message, names)


def test_streamed_deltas_assemble_to_the_calls_unstreamed(served):
    _, s = served
    c = _client(s)
    for ask, choice in [(ASKS[0], "required"), (ASKS[1], {"type": "function", "function": {"name": "add"}})]:
        whole = c.chat.completions.create(model="m", messages=_ask(ask), tools=TOOLS, tool_choice=choice, seed=3, **GREEDY)
        calls: dict[int, dict[str, str]] = {}
        finish = None
        for chunk in c.chat.completions.create(model="m", messages=_ask(ask), tools=TOOLS, tool_choice=choice, seed=3,
                                               stream=True, **GREEDY):  # fmt: skip
            for delta in chunk.choices[0].delta.tool_calls or ():
                if delta.index not in calls:  # the first delta of a call names it
                    assert delta.id and delta.id.startswith("call_") and delta.type == "function" and delta.function.name
                    calls[delta.index] = {"name": delta.function.name, "arguments": ""}
                else:
                    assert delta.id is None and not delta.function.name
                calls[delta.index]["arguments"] += delta.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        assert finish == "tool_calls"
        assert [calls[i] for i in sorted(calls)] == [
            {"name": t.function.name, "arguments": t.function.arguments} for t in whole.choices[0].message.tool_calls]
        _valid_calls(whole.choices[0].message, set(SCHEMAS))


def test_none_gives_text(served):
    _, s = served
    r = _client(s).chat.completions.create(model="m", messages=_ask(ASKS[0]), tools=TOOLS, tool_choice="none", **GREEDY)
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.content


def test_a_tool_result_turn_answers(served):
    kind, s = served
    c = _client(s)
    first = c.chat.completions.create(model="m", messages=_ask(ASKS[0]), tools=TOOLS, tool_choice="required", **GREEDY)
    call = first.choices[0].message.tool_calls[0]
    turns = [*_ask(ASKS[0]),
             {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
             {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})}]  # fmt: skip
    for choice in ("none", "auto"):
        r = c.chat.completions.create(model="m", messages=turns, tools=TOOLS, tool_choice=choice, **GREEDY)
        message = r.choices[0].message
        if message.tool_calls:  # auto may call again: then validly
            assert choice == "auto" and r.choices[0].finish_reason == "tool_calls"
            _valid_calls(message, set(SCHEMAS))
        else:
            assert message.content and r.choices[0].finish_reason in ("stop", "length"), (kind, choice, r)
            assert not message.content.lstrip().startswith('{"response"')  # the generic format's reply, unwrapped


def test_a_reply_in_the_generic_format_streams_and_a_cut_one_shows_no_wrapper(served):
    kind, s = served
    if kind != "chatml":
        pytest.skip("the generic format is for a template without tools (chatml)")
    for max_tokens in (12, 96):  # 12: cut by the token limit inside {"response": "..."}
        stream = _client(s).chat.completions.create(model="m", messages=_ask(ASKS[2]), tools=TOOLS, tool_choice="auto",
                                                    stream=True, temperature=0, max_tokens=max_tokens)  # fmt: skip
        chunks = [c for c in stream if c.choices]
        pieces = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
        calls = [c for c in chunks if c.choices[0].delta.tool_calls]
        assert not calls, "greedy SmolLM2 replies to a greeting (else this test asks the wrong question)"
        text = "".join(pieces)
        assert len(pieces) >= 3, pieces  # as it is written, not one chunk at the end
        assert text.strip() and "{" not in text and '"response"' not in text, text
        whole = _client(s).chat.completions.create(model="m", messages=_ask(ASKS[2]), tools=TOOLS, tool_choice="auto",
                                                   temperature=0, max_tokens=max_tokens)  # fmt: skip
        content = whole.choices[0].message.content  # not compared with the stream's: a cached prefix may round otherwise
        assert content and "{" not in content and '"response"' not in content, content


def test_bad_tool_input_is_a_400_and_the_server_keeps_serving(served):
    _, s = served
    c = _client(s)
    bad_schema = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "strang"}}}}}]
    cases = [
        (dict(tools=bad_schema), "tools[0].function.parameters"),
        (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice.function.name"),
        (dict(messages=[*_ask("hi"), {"role": "tool", "tool_call_id": "call_x", "content": "1"}], tools=TOOLS), "messages[1].tool_call_id"),
        (dict(tools=[{"type": "function", "function": {"name": "has space"}}]), "tools[0].function.name"),
    ]  # fmt: skip
    for fields, param in cases:
        with pytest.raises(openai.BadRequestError) as info:
            c.chat.completions.create(model="m", **{"messages": _ask("hi"), **fields}, max_tokens=8)
        assert info.value.status_code == 400
        assert info.value.body["param"] == param and info.value.body["message"], info.value.body
    assert s.json("GET", "/health") == (200, {"status": "ok"})
    r = c.chat.completions.create(model="m", messages=_ask("hi"), max_tokens=4)
    assert r.choices[0].message.content is not None and s.proc.poll() is None


def test_a_tool_set_that_does_not_compile_is_a_400_naming_tools(served):
    """Issue 40: the tools' constraint is compiled where the request is prepared (off the engine
    thread), so one that llguidance cannot compile (Python's `re` takes `\\Z`, llguidance does not)
    is a 400 naming `tools`, not a 500; the server keeps serving."""
    _, s = served
    c = _client(s)
    odd = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "string", "pattern": "^a\\Z"}}, "required": ["x"]}}}]  # fmt: skip
    for choice in ("required", "auto"):
        with pytest.raises(openai.BadRequestError) as info:
            c.chat.completions.create(model="m", messages=_ask("hi"), tools=odd, tool_choice=choice, max_tokens=8)
        body = info.value.body
        assert info.value.status_code == 400 and body["param"] == "tools" and "cannot compile" in body["message"], body
    assert s.json("GET", "/health") == (200, {"status": "ok"})
