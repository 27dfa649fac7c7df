"""A tool's parameters are a description first: every valid JSON Schema is taken on every wire
(Claude Code's default request has `propertyNames` in tools[14] and `format: "uri"` in tools[20]),
what the constraint cannot enforce is left out of it and named (the log, and the answer's
`x-localinfer-unenforced` header), a finished call is checked against the whole schema, and errors
name the client's own fields. A response_format still refuses what it cannot enforce."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest

pytest.importorskip("starlette")

from test_serve import HI, FakeEngine, _state, call

from localinfer.request import request as rq
from localinfer.request.toolcalls import families as F
from localinfer.request.toolcalls import spec
from localinfer.request.toolcalls.enforce import enforceable, violation
from localinfer.request.toolcalls.plan import ToolPlan
from localinfer.request.toolcalls.spec import ToolChoice
from localinfer.serve.http.sending import UNENFORCED_HEADER, call_checker

# Shapes from Claude Code's and Codex's tools: keywords llguidance has no rule for, formats, remote refs
AGENT_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {
        "env": {"type": "object", "propertyNames": {"pattern": "^[A-Z_]+$"}, "additionalProperties": {"type": "string"}},
        "url": {"type": "string", "format": "uri"},
        "when": {"type": "string", "pattern": "^\\p{N}+$"},  # ECMA's \\p{..}: Python's parser has none
        "edits": {"type": "array", "items": {"$ref": "#/definitions/edit"}, "uniqueItems": True, "minItems": 1},
        "other": {"$ref": "https://example.com/schema.json"},
        "mode": {"type": "string", "enum": ["a", "b"]},
    },
    "definitions": {"edit": {"type": "object", "properties": {"old": {"type": "string"}}, "required": ["old"],
                             "not": {"required": ["new"]}}},
    "required": ["url", "mode"],
    "if": {"properties": {"mode": {"const": "a"}}}, "then": {"required": ["env"]},
}  # fmt: skip
LEFT_OUT = {"#/properties/env: propertyNames", "#/properties/url: format", "#/properties/when: pattern",
            "#/properties/edits: uniqueItems", "#/properties/other: $ref", "#/definitions/edit: not", "#: if", "#: then"}  # fmt: skip


def test_what_the_constraint_cannot_enforce_is_left_out_and_named():
    kept, left = enforceable(AGENT_SCHEMA)
    assert set(left) == LEFT_OUT
    assert kept["properties"]["env"] == {"type": "object", "additionalProperties": {"type": "string"}}
    assert kept["properties"]["edits"]["items"] == {"$ref": "#/definitions/edit"}  # a local $ref is enforced
    assert kept["properties"]["mode"]["enum"] == ["a", "b"] and kept["required"] == ["url", "mode"]
    assert "if" not in kept and "not" not in kept["definitions"]["edit"]
    # a $ref into a part left out would dangle: it is left out too
    kept, left = enforceable({"type": "object", "not": {"type": "string"}, "properties": {"a": {"$ref": "#/not"}}})
    assert kept == {"type": "object", "properties": {"a": {}}} and set(left) == {"#: not", "#/properties/a: $ref"}


def test_the_tool_is_described_whole_and_enforced_where_it_can_be():
    tools = spec.tools("tools", [{"type": "function", "function": {"name": "fetch", "parameters": AGENT_SCHEMA}}], spec.check_schema)
    tool = tools[0]
    assert tool.parameters == AGENT_SCHEMA, "the model is shown the schema as sent"
    assert tool.to_openai()["function"]["parameters"] == AGENT_SCHEMA
    assert {u.removeprefix("tools[0].function.parameters ") for u in tool.unenforced} == LEFT_OUT
    fmt, _ = ToolPlan(F.GENERIC, tools, ToolChoice("required")).constraint()
    text = json.dumps(fmt.schema)
    assert "propertyNames" not in text and "uniqueItems" not in text and '"uri"' not in text
    call = {"name": "fetch", "arguments": {"url": "not a uri", "mode": "b"}}
    jsonschema.validate({"tool_calls": [call]}, fmt.schema)  # what the constraint holds a call to
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tool_calls": [{"name": "fetch", "arguments": {"url": "x"}}]}, fmt.schema)  # required kept


def test_a_finished_call_is_checked_against_the_whole_schema():
    assert violation(AGENT_SCHEMA, '{"url": "https://x.org", "mode": "b"}') is None
    why = violation(AGENT_SCHEMA, '{"url": "https://x.org", "mode": "a"}')  # if mode a then env: left out, so checked here
    assert why is not None and "env" in why
    why = violation(AGENT_SCHEMA, '{"url": "u", "mode": "b", "env": {"lower": "x"}}')
    assert why is not None and "lower" in why
    said: list[str] = []
    tools = spec.tools("tools", [{"name": "fetch", "parameters": AGENT_SCHEMA}], spec.check_schema)
    check = call_checker(SimpleNamespace(tools=tools), said.append)
    assert check is not None
    check(SimpleNamespace(tool_calls=[spec.ToolCall("c1", "fetch", '{"url": "u", "mode": "b"}')]))
    assert said == []
    check(SimpleNamespace(tool_calls=[spec.ToolCall("c2", "fetch", '{"url": "u", "mode": "a"}')]))
    assert len(said) == 1 and "fetch" in said[0] and "env" in said[0]
    plain = spec.tools("tools", [{"name": "g", "parameters": {"type": "object"}}], spec.check_schema)
    assert call_checker(SimpleNamespace(tools=plain), said.append) is None, "nothing left out: nothing to check"


def test_the_api_and_batch_lines_take_them_too():
    r = rq.build("hi", tools=[{"type": "function", "function": {"name": "fetch", "parameters": AGENT_SCHEMA}}])
    assert r.tools[0].unenforced and r.tools[0].parameters == AGENT_SCHEMA


def test_a_response_format_still_refuses_what_it_cannot_enforce():
    status, _, data = call(_state(FakeEngine()), "POST", "/v1/chat/completions", {
        "messages": HI, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": AGENT_SCHEMA}}})
    assert status == 400 and "not supported" in json.loads(data)["error"]["message"]


class _Engine(FakeEngine):
    def prepare(self, request: Any, **kw: Any) -> Any:  # clamp: Anthropic's max_tokens
        return super().prepare(request)


def _engine() -> Any:
    engine = _Engine()
    engine.loaded = SimpleNamespace(template=SimpleNamespace(template="{{ messages }}"))  # Ollama's routes read it
    return engine


_WIRES = [
    ("/v1/chat/completions", {"messages": HI, "tools": [{"type": "function", "function": {"name": "ok", "parameters": {"type": "object"}}},
                                                       {"type": "function", "function": {"name": "fetch", "parameters": AGENT_SCHEMA}}]},
     "tools[1].function.parameters"),
    ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": HI, "tools": [
        {"name": "ok", "input_schema": {"type": "object"}}, {"name": "fetch", "input_schema": AGENT_SCHEMA}]}, "tools[1].input_schema"),
    ("/v1/responses", {"input": "hi", "tools": [{"type": "web_search"}, {"type": "function", "name": "fetch", "parameters": AGENT_SCHEMA}]},
     "tools[1].parameters"),
    ("/api/chat", {"model": "m", "messages": HI, "stream": False, "tools": [
        {"type": "function", "function": {"name": "ok"}}, {"type": "function", "function": {"name": "fetch", "parameters": AGENT_SCHEMA}}]},
     "tools[1].function.parameters"),
]  # fmt: skip


@pytest.mark.parametrize("path, body, field", _WIRES, ids=[w[0] for w in _WIRES])
@pytest.mark.parametrize("stream", [False, True])
def test_every_wire_answers_and_says_what_was_not_enforced(path, body, field, stream):
    said: list[str] = []
    state = _state(_engine())
    state.say = said.append
    for _ in range(2):  # an agent resends its tools every turn: said once
        status, headers, data = call(state, "POST", path, {**body, "stream": stream})
        assert status == 200, data
        note = headers[UNENFORCED_HEADER.decode()]
        assert f"{field} #/properties/env: propertyNames" in note and f"{field} #: if" in note
    assert len(said) == 1 and "not enforced" in said[0] and f"{field} #/properties/url: format" in said[0]


@pytest.mark.parametrize("path, body, field", [
    ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": HI, "tools": [{"name": "f", "input_schema": {"type": "object", "required": "x"}}]},
     "tools[0].input_schema"),
    ("/v1/responses", {"input": "hi", "tools": [{"type": "web_search"}, {"type": "function", "name": "f", "parameters": {"type": "strng"}}]},
     "tools[1].parameters"),
    ("/v1/responses", {"input": "hi", "tools": [{"type": "web_search"}, {"type": "function", "name": "f"}, {"type": "function", "name": "f"}]},
     "tools[2].name"),
])  # fmt: skip
def test_errors_name_the_clients_own_fields(path, body, field):
    status, _, data = call(_state(_engine()), "POST", path, body)
    assert status == 400 and field in data.decode(), data
    assert "parameters" not in data.decode() or "parameters" in field
