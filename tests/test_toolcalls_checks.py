"""Issue 40: in ``auto`` an answer that starts with ``{`` (Llama 3) or ``[{`` (Mistral) is not
constrained, so a "call" in it counts only if it names an offered tool and its arguments are a JSON
object; otherwise it is content and the answer does not finish with ``tool_calls``. Whole and
streamed answers agree."""

from __future__ import annotations

import random

import pytest

from localinfer.request.toolcalls.parser import CallArgs, CallParser, CallStart, Text
from localinfer.request.toolcalls.plan import finish_reason, plan_for
from localinfer.request.toolcalls.spec import Tool, ToolChoice

OFFERED = (Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}}), Tool("get_time", "", None))
LLAMA3_TEMPLATE = '{% if tools %}<|start_header_id|>{"name": ..., "parameters": ...}{% endif %}'
MISTRAL_TEMPLATE = "{% if tools %}[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]"


def _plan(template: str, choice: ToolChoice = ToolChoice()):
    return plan_for(OFFERED, choice, True, template)


def _streamed(plan, text: str, seed: int) -> tuple[str, list[tuple[str, str]]]:
    p: CallParser = plan.parser()
    rng, events, i = random.Random(seed), [], 0
    while i < len(text):
        n = rng.randint(1, 5)
        events += p.feed(text[i : i + n])
        i += n
    events += p.finish()
    content = "".join(e.text for e in events if isinstance(e, Text))
    calls = {e.index: [e.name, ""] for e in events if isinstance(e, CallStart)}
    for e in events:
        if isinstance(e, CallArgs):
            calls[e.index][1] += e.text
    return content, [tuple(c) for c in calls.values()]


@pytest.mark.parametrize(
    ("template", "text", "calls"),
    [
        (LLAMA3_TEMPLATE, '{"name": "delete_files", "parameters": {"path": "/"}}', []),  # not offered
        (LLAMA3_TEMPLATE, '{"name": "get_weather", "parameters": "Oslo"}', []),  # arguments not an object
        (LLAMA3_TEMPLATE, '{"name": "get_weather", "parameters": [1, 2]}', []),
        (LLAMA3_TEMPLATE, '{"name": "get_weather", "parameters": {"city": "Oslo"}}', [("get_weather", '{"city": "Oslo"}')]),
        (MISTRAL_TEMPLATE, '[{"name": "nope", "arguments": {}}]', []),
        (MISTRAL_TEMPLATE, '[{"name": "nope", "arguments": {}}, {"name": "get_time", "arguments": {}}]', [("get_time", "{}")]),
        (MISTRAL_TEMPLATE, '[{"name": "get_time", "arguments": 5}]', []),
    ],
)  # fmt: skip
def test_only_offered_tools_with_object_arguments_are_calls(template, text, calls):
    plan = _plan(template)
    content, made = plan.parse(text)
    assert [(c.name, c.arguments) for c in made] == calls
    assert finish_reason(made, "stop") == ("tool_calls" if calls else "stop")
    if not calls:
        assert content == text  # what was no call is the answer's text
    for seed in range(10):
        assert _streamed(plan, text, seed) == (content, calls)


def test_a_chosen_function_is_the_only_name_and_a_cut_call_is_not_tool_calls():
    plan = _plan(LLAMA3_TEMPLATE, ToolChoice("function", "get_time"))
    assert plan.parse('{"name": "get_weather", "parameters": {}}')[1] == []
    content, cut = _plan(LLAMA3_TEMPLATE).parse('{"name": "get_weather", "parameters": {"city": "Os')
    assert [(c.name, c.arguments) for c in cut] == [("get_weather", '{"city": "Os')]  # kept as written (max_tokens)
    assert finish_reason(cut, "length") == "length" and finish_reason(cut, "stop") == "stop"
