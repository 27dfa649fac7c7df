"""Tool calls without a model: the families' formats parsed whole and streamed piece by piece (the
same calls either way), family detection, the prompt each family gets, the constraint a forced
choice makes, and the request checks (serve, batch lines, the API's build)."""

from __future__ import annotations

import json
import random

import pytest

from localinfer.request import request as rq
from localinfer.batch.io import parse_input
from localinfer.errors import UsageError
from localinfer.request.request import BatchRequest, InputError
from localinfer.request.toolcalls import families as F
from localinfer.request.toolcalls.parser import CallArgs, CallParser, CallStart, Text, parse
from localinfer.request.toolcalls.plan import ToolPlan, plan_for
from localinfer.request.toolcalls.spec import Tool, ToolChoice

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}

ANSWERS = [
    (F.HERMES, 'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris \\"}{\\" [x]"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
     "Let me look.", [("get_weather", {"city": 'Paris "}{" [x]'}), ("get_time", {})]),
    (F.LLAMA3, ' {"name": "get_weather", "parameters": {"city": "Oslo"}}', "", [("get_weather", {"city": "Oslo"})]),
    (F.LLAMA3, '<|python_tag|>{"name": "get_time", "parameters": {}}', "", [("get_time", {})]),
    (F.MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "get_time", "arguments": {}}]',
     "", [("get_weather", {"city": "Rome"}), ("get_time", {})]),
    (F.GENERIC, '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Lima"}}]}', "", [("get_weather", {"city": "Lima"})]),
    (F.GENERIC, '{"response": "It is sunny {\\"really\\"}."}', 'It is sunny {"really"}.', []),
    (F.HERMES, "No tools needed <tool", "No tools needed <tool", []),  # a marker's start that never completes
    (F.HERMES, "Odd <tool_call> not a call", "Odd <tool_call> not a call", []),
    (F.LLAMA3, "Hello {not json}", "Hello {not json}", []),
    (F.MISTRAL, "[1, 2] is a list", "[1, 2] is a list", []),
]


def _streamed(family: F.Family, text: str, rng: random.Random) -> tuple[str, list[tuple[str, str, str]]]:
    """Content and (id, name, arguments) assembled from the events of ``text`` fed in random pieces."""
    p, events = CallParser(family), []
    i = 0
    while i < len(text):
        n = rng.randint(1, 7)
        events += p.feed(text[i : i + n])
        i += n
    events += p.finish()
    content, calls = "", {}
    for e in events:
        if isinstance(e, Text):
            content += e.text
        elif isinstance(e, CallStart):
            assert e.index == len(calls) and e.id.startswith("call_")
            calls[e.index] = [e.id, e.name, ""]
        else:
            assert isinstance(e, CallArgs) and e.index in calls
            calls[e.index][2] += e.text
    return content, [tuple(c) for c in calls.values()]


@pytest.mark.parametrize(("family", "text", "content", "calls"), ANSWERS)
def test_each_family_parses_whole_and_streamed_to_the_same_calls(family, text, content, calls):
    whole = parse(family, text)
    assert whole.content == content
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == calls
    for seed in range(20):
        s_content, s_calls = _streamed(family, text, random.Random(seed))
        assert s_content == content
        assert [(n, a) for _, n, a in s_calls] == [(c.name, c.arguments) for c in whole.calls]


def test_a_call_cut_short_keeps_what_was_written_and_parallel_false_keeps_one():
    cut = parse(F.HERMES, '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa')
    assert [(c.name, c.arguments) for c in cut.calls] == [("get_weather", '{"city": "Pa')]
    one = parse(F.MISTRAL, ANSWERS[3][1], parallel=False)
    assert [c.name for c in one.calls] == ["get_weather"]


def test_the_generic_reply_streams_as_text_and_a_cut_one_never_shows_its_json():
    # a template without tools: the answer is held to {"response": "..."} - its text is the content
    reply = json.dumps({"response": 'Hello, "w\\orld" \u00e9\U0001F600\n'}, ensure_ascii=True)
    parser = CallParser(F.GENERIC)
    texts = [e.text for piece in reply for e in parser.feed(piece) if isinstance(e, Text)]
    texts += [e.text for e in parser.finish() if isinstance(e, Text)]
    assert "".join(texts) == parser.content == 'Hello, "w\\orld" \u00e9\U0001F600\n'
    assert len(texts) > 10, "each piece as it comes, not one chunk at the end"
    for cut in range(len(reply)):
        content = parse(F.GENERIC, reply[:cut]).content
        assert "{" not in content and "response" not in content, (cut, content)  # max_tokens: no wrapper
    assert parse(F.GENERIC, '{"response": "Hello, wor').content == "Hello, wor"
    assert parse(F.GENERIC, '{"response": "a\\ud83d\\ude00b"}').content == "a\U0001F600b"
    assert parse(F.GENERIC, '{"response": "a\\ud83dxb"}').content == "a\ufffdxb"  # a lone half is no text
    calls = parse(F.GENERIC, '{"tool_calls": [{"name": "f", "arguments": {}}]}')
    assert [c.name for c in calls.calls] == ["f"] and calls.content == ""


def test_the_opening_written_into_the_prompt_is_part_of_the_answer():
    p = parse(F.HERMES, '{"name": "get_time", "arguments": {}}\n</tool_call>', opening=F.HERMES.opening)
    assert p.content == "" and [c.name for c in p.calls] == ["get_time"]


def test_families_are_detected_from_the_template():
    assert F.detect("{% for tool in tools %}<tool_call>{{ tool | tojson }}</tool_call>{% endfor %}") is F.HERMES
    assert F.detect("{% if tools %}[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]") is F.MISTRAL
    assert F.detect('{% if tools %}<|start_header_id|>{"name": ..., "parameters": ...}{% endif %}') is F.LLAMA3
    assert F.detect("{{ '<|python_tag|>' }}{% if tools %}{% endif %}") is F.LLAMA3
    assert F.detect("{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}") is F.GENERIC
    assert F.detect(None) is F.GENERIC
    assert F.detect("{% if tools %}<tool_call>\n<function=x>{% endif %}") is F.GENERIC  # Qwen3-Coder's XML


def _tools(*objs):
    return rq.build("hi", tools=list(objs)).tools


def test_the_generic_format_offers_the_tools_in_the_system_message_and_rewrites_tool_turns():
    plan = ToolPlan(F.GENERIC, _tools(WEATHER), ToolChoice())
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    msgs = plan.messages([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
                          {"role": "assistant", "content": "", "tool_calls": [call]},
                          {"role": "tool", "content": "12 C", "tool_call_id": "c1", "name": "get_weather"}])  # fmt: skip
    assert msgs[0]["role"] == "system" and msgs[0]["content"].startswith("Be brief.\n\nYou can call")
    assert '"get_weather"' in msgs[0]["content"] and "`response`" in msgs[0]["content"]
    assert json.loads(msgs[2]["content"]) == {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}
    assert msgs[3]["role"] == "user" and json.loads(msgs[3]["content"])["tool_response"]["content"] == "12 C"
    assert plan.variables() == {}
    assert ToolPlan(F.GENERIC, plan.tools, ToolChoice("none")).messages([{"role": "user", "content": "x"}]) == [
        {"role": "user", "content": "x"}]  # none: no tools offered


def test_the_generic_offer_is_compact_json_less_what_tells_the_model_nothing():
    params = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "$comment": "x",
              "properties": {"$id": {"type": "string", "$id": "#a"}, "n": {"enum": [{"$schema": 1}]}}}  # fmt: skip
    tool = {"type": "function", "function": {"name": "f", "description": "d", "parameters": params}}
    offer = ToolPlan(F.GENERIC, _tools(tool), ToolChoice()).messages([{"role": "user", "content": "x"}])[0]["content"]
    listed = json.loads(offer.split("\n")[1])
    assert listed == [{"name": "f", "description": "d", "parameters": {
        "type": "object", "properties": {"$id": {"type": "string"}, "n": {"enum": [{"$schema": 1}]}}}}]  # fmt: skip
    assert offer.split("\n")[1] == json.dumps(listed, separators=(",", ":")), "no indentation: a third fewer tokens"


def test_native_templates_get_tools_and_a_forced_call_opens_in_the_prompt():
    plan = ToolPlan(F.HERMES, _tools(WEATHER, TIME), ToolChoice("required"))
    assert plan.variables()["tools"][0] == WEATHER and plan.opening == "<tool_call>\n"
    assert ToolPlan(F.HERMES, plan.tools, ToolChoice("auto")).opening == ""
    assert ToolPlan(F.HERMES, plan.tools, ToolChoice("none")).variables() == {}


def test_forced_choices_constrain_to_calls_whose_arguments_follow_parameters():
    jsonschema = pytest.importorskip("jsonschema")
    tools = _tools(WEATHER, TIME)
    fmt, after = ToolPlan(F.HERMES, tools, ToolChoice("function", "get_weather")).constraint()
    assert after is None
    good, bad = {"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_weather", "arguments": {}}
    jsonschema.validate(good, fmt.schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, fmt.schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_time", "arguments": {}}, fmt.schema)
    lazy = ToolPlan(F.HERMES, tools, ToolChoice("auto")).constraint()
    assert lazy is not None and lazy[1] == "<tool_call>"
    generic, after = ToolPlan(F.GENERIC, tools, ToolChoice("auto"), parallel=False).constraint()
    assert after is None  # the generic format is always JSON
    jsonschema.validate({"response": "hi"}, generic.schema)
    jsonschema.validate({"tool_calls": [good]}, generic.schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tool_calls": [good, good]}, generic.schema)  # parallel_tool_calls false
    assert ToolPlan(F.HERMES, tools, ToolChoice("none")).constraint() is None


def test_plan_is_made_only_for_requests_with_tools():
    def plan(r, template):
        return plan_for(r.tools, r.tool_choice, r.parallel_tool_calls, template)

    assert plan(rq.build("hi"), "x") is None
    plan = plan(rq.build("hi", tools=[WEATHER], tool_choice="required"), "{{ tools }}<tool_call>")
    assert plan is not None and plan.family is F.HERMES and plan.choice == ToolChoice("required")


@pytest.mark.parametrize(("tools", "choice", "problem"), [
    ([{"type": "function", "function": {"name": "bad name"}}], None, "'tools[0].function.name' must be 1 to 64"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "strang"}}}}}],
     None, "'tools[0].function.parameters' is not a valid schema: #/properties/a: unknown type 'strang'"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "minProperties": -1, "required": "a"}}}],
     None, "'tools[0].function.parameters' is not a valid schema: #: 'required' must be a list"),
    ([WEATHER, WEATHER], None, "repeats the name 'get_weather'"),
    ([{"type": "retrieval"}], None, "'tools[0].type' must be 'function'"),
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "names 'nope', which is not one of the tools"),
    ([WEATHER], "sometimes", "'tool_choice' must be 'auto', 'none', 'required' or a function"),
    ([], "required", "no 'tools' are given"),
])  # fmt: skip
def test_bad_tools_are_refused_by_name_in_the_api_and_in_batch_lines(tools, choice, problem):
    with pytest.raises(UsageError) as info:
        rq.build("hi", tools=tools, tool_choice=choice)
    assert problem in str(info.value)
    line = {"id": 1, "prompt": "hi", "tools": tools, **({} if choice is None else {"tool_choice": choice})}
    item = parse_input(json.dumps(line).encode(), "jsonl")[0]
    assert isinstance(item, InputError) and problem in item.reason, item


def test_batch_lines_and_the_api_take_tools_and_tool_turns():
    line = {"id": "a", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER], "tool_choice": "required",
            "parallel_tool_calls": False}  # fmt: skip
    item = parse_input(json.dumps(line).encode(), "jsonl")[0]
    assert isinstance(item, BatchRequest)
    assert item.tools == (Tool("get_weather", "The weather in a city", WEATHER["function"]["parameters"]),)
    assert item.tool_choice == ToolChoice("required") and item.parallel_tool_calls is False
    turns = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "12 C"}]  # fmt: skip
    r = rq.build(messages=turns, tools=[WEATHER])
    assert r.messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}  # templates read an object
    assert r.messages[2] == {"role": "tool", "content": "12 C", "tool_call_id": "c1", "name": "get_weather"}
    with pytest.raises(UsageError, match="tool_call_id"):
        rq.build(messages=[*turns[:1], turns[2]], tools=[WEATHER])


# -- the tools through real templates, as transformers renders them ----------------------------------------
REAL = ["Qwen-Qwen2.5-7B-Instruct.jinja", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
        "meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja",
        "mistralai-Mistral-Nemo-Instruct-2407.jinja", "Qwen-Qwen3-0.6B.jinja"]  # fmt: skip
FAMILY = {"Qwen-Qwen2.5-7B-Instruct.jinja": F.HERMES, "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": F.HERMES,
          "meta-llama-Llama-3.1-8B-Instruct.jinja": F.LLAMA3, "meta-llama-Llama-3.2-3B-Instruct.jinja": F.LLAMA3,
          "mistralai-Mistral-Nemo-Instruct-2407.jinja": F.MISTRAL, "Qwen-Qwen3-0.6B.jinja": F.HERMES}  # fmt: skip


@pytest.mark.parametrize("name", REAL)
def test_real_templates_get_the_tools_and_tool_turns_as_transformers_renders_them(name):
    """Our render of a conversation with tools, a call and its result (the request's messages, as
    serve checks them) is transformers' ``apply_chat_template`` render of the same, byte for byte."""
    chat_template_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    from templatesource import real_template

    from localinfer.engine.templates import ChatTemplate
    from localinfer.request.rules import messages as checked

    source = real_template(name.removesuffix(".jinja"))
    assert F.detect(source) is FAMILY[name]
    turns = checked("messages", [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "abc123def", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "abc123def", "content": "12 C"},
    ])  # fmt: skip
    r = rq.build(messages=turns, tools=[WEATHER, TIME])
    plan = plan_for(r.tools, r.tool_choice, r.parallel_tool_calls, source)
    ours = ChatTemplate("gguf", source, bos_text="<s>", eos_text="</s>").render(plan.messages(turns), **plan.variables()).text
    theirs = chat_template_utils.render_jinja_template(
        conversations=[plan.messages(turns)], tools=plan.variables()["tools"], chat_template=source, add_generation_prompt=True,
        bos_token="<s>", eos_token="</s>",
    )  # fmt: skip
    theirs = theirs[0][0] if isinstance(theirs, tuple) else theirs
    theirs = theirs[0] if isinstance(theirs, list) else theirs
    assert "get_weather" in ours and "12 C" in ours
    assert ours == theirs


def test_a_forced_call_takes_only_the_declared_arguments_unless_parameters_allow_more():
    jsonschema = pytest.importorskip("jsonschema")
    add = {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}  # fmt: skip
    open_ = {"type": "function", "function": {"name": "open", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True}}}  # fmt: skip
    fmt, _ = ToolPlan(F.HERMES, _tools(add, open_), ToolChoice("function", "add")).constraint()
    jsonschema.validate({"name": "add", "arguments": {"a": 1}}, fmt.schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "add", "arguments": {"a": 1, "c": 3}}, fmt.schema)
    fmt, _ = ToolPlan(F.HERMES, _tools(add, open_), ToolChoice("function", "open")).constraint()
    jsonschema.validate({"name": "open", "arguments": {"a": 1, "c": 3}}, fmt.schema)


def test_tools_are_refused_for_a_server_not_dropped():
    from localinfer.backends.remote import RemoteBackend

    backend = RemoteBackend.__new__(RemoteBackend)
    backend.name = "m"
    assert "tools" not in backend.body(rq.build("hi"))
    with pytest.raises(UsageError, match="--endpoint"):
        backend.body(rq.build("hi", tools=[WEATHER]))


def test_serve_answers_in_openai_shapes_whole_and_streamed():
    from localinfer.engine.types import GenerationStats
    from test_finish import of_text
    from localinfer.serve.scheduler.worker import Ended
    from localinfer.serve.wires.chat_completions import CompletionWriter

    text = 'Sure. <tool_call>{"name":"get_weather","arguments":{"city":"Oslo"}}</tool_call>'
    plan = ToolPlan(F.HERMES, _tools(WEATHER), ToolChoice())
    stats = GenerationStats(prompt_tokens=5, completion_tokens=20)
    answer = CompletionWriter.new("chat", "m")

    def Outcome(text: str, reason: str, stats: GenerationStats, *times: float) -> Ended:  # the engine's, finished
        done = of_text(text, reason, tools=plan)
        queue_s, ttft_s, total_s = times
        return Ended(done.text, done.finish_reason, stats, ttft_s, total_s, tool_calls=done.tool_calls, queue_s=queue_s)

    whole = answer.whole(Outcome(text, "stop", stats, 0.0, 0.1, 0.2))["choices"][0]
    assert whole["finish_reason"] == "tool_calls" and whole["message"]["content"] == "Sure. "
    (call,) = whole["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city":"Oslo"}'}
    only = answer.whole(Outcome(text[6:], "stop", stats, 0.0, 0.1, 0.2))["choices"][0]
    assert only["message"]["content"] is None  # OpenAI: null when the answer is only calls
    cut = answer.whole(Outcome(text[:-20], "length", stats, 0.0, 0.1, 0.2))["choices"][0]
    assert cut["finish_reason"] == "length" and cut["message"]["tool_calls"]  # cut short: not "tool_calls"

    parser = plan.parser()
    events = parser.feed(text[:30]) + parser.feed(text[30:]) + parser.finish()
    chunks = [json.loads(c[6:]) for c in answer.event_chunks(events).split(b"\n\n") if c]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"content": "Sure. "}
    first = deltas[1]["tool_calls"][0]
    assert first["index"] == 0 and first["id"] == parser.calls[0].id and first["function"] == {"name": "get_weather", "arguments": ""}
    rest = [d["tool_calls"][0] for d in deltas[2:]]
    assert all(set(r) == {"index", "function"} and r["index"] == 0 for r in rest)
    assert "".join(r["function"]["arguments"] for r in rest) == '{"city":"Oslo"}'


def test_the_api_and_batch_answers_carry_the_calls():
    from localinfer.answer.answer import Answer
    from localinfer.request.toolcalls.spec import ToolCall

    a = Answer("", "m", tool_calls=[ToolCall("call_1", "get_time", "{}")])
    expected = [{"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]
    assert a.to_json()["tool_calls"] == expected and a.batch_json(7)["tool_calls"] == expected
    assert "tool_calls" not in Answer("hi", "m").batch_json(7)
