"""Tool calls on the real SmolLM2 model outside serve: the library API (``model.chat(tools=...)``,
whole and streamed) and `localinfer batch` lines with a ``tools`` field, end to end."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

pytestmark = pytest.mark.slow
jsonschema = pytest.importorskip("jsonschema")

ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 100},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 100}}, "required": ["a", "b"]}}}  # fmt: skip
PARAMS = ADD["function"]["parameters"]
ASK = [{"role": "user", "content": "Add 17 and 25."}]


def test_the_api_returns_calls_that_validate_and_streams_no_call_text(smollm2_path):
    import localinfer

    with localinfer.load(str(smollm2_path), n_ctx=1024, n_threads=2) as model:
        r = model.chat(ASK, tools=[ADD], tool_choice="required", temperature=0, max_tokens=64)
        assert r.finish_reason == "tool_calls" and r.text == ""
        (call,) = r.tool_calls
        assert call.name == "add" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.arguments), PARAMS)
        chunks = list(model.stream(ASK, tools=[ADD], tool_choice="required", temperature=0, max_tokens=64))
        assert "".join(c.text for c in chunks) == ""  # the call's JSON is not the answer's text
        assert [(c.name, c.arguments) for c in chunks[-1].result.tool_calls] == [(call.name, call.arguments)]
        plain = model.chat(ASK, tools=[ADD], tool_choice="none", temperature=0, max_tokens=16)
        assert plain.tool_calls == [] and plain.text and plain.finish_reason in ("stop", "length")


def test_batch_lines_with_tools_answer_with_calls(smollm2_path, tmp_path):
    lines = [{"id": "call", "messages": ASK, "tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "add"}}},
             {"id": "text", "messages": ASK},
             {"id": "bad", "messages": ASK, "tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "sub"}}}]  # fmt: skip
    reqs = tmp_path / "reqs.jsonl"
    reqs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    proc = run_cli("batch", str(reqs), "-m", str(smollm2_path), "--parallel", "2", "-n", "64", "--temperature", "0",
                   "-c", "1024", "-t", "1", "-q")  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr.decode()  # 1: a line failed (the bad one)
    by_id = {r["id"]: r for r in map(json.loads, proc.stdout.decode().splitlines())}
    call = by_id["call"]
    assert call["finish_reason"] == "tool_calls" and call["text"] == ""
    (c,) = call["tool_calls"]
    assert c["type"] == "function" and c["function"]["name"] == "add"
    jsonschema.validate(json.loads(c["function"]["arguments"]), PARAMS)
    assert "tool_calls" not in by_id["text"] and by_id["text"]["text"]
    assert "names 'sub', which is not one of the tools" in by_id["bad"]["error"]


def test_a_tool_with_keywords_the_constraint_leaves_out_is_called_on_the_real_model(smollm2_path):
    # Claude Code's shapes: propertyNames, format "uri", a local $ref (relative to the tool's own root,
    # which the answer's schema holds under its $defs) and if/then
    edit = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 20}}, "required": ["path"]}
    params = {"type": "object", "properties": {
        "url": {"type": "string", "format": "uri", "maxLength": 30},
        "env": {"type": "object", "propertyNames": {"pattern": "^[A-Z]+$"}, "maxProperties": 2},
        "edits": {"type": "array", "items": {"$ref": "#/$defs/edit"}, "minItems": 1, "maxItems": 2}},
        "required": ["url", "edits"], "$defs": {"edit": edit}, "if": {"required": ["env"]}, "then": {}}  # fmt: skip
    tool = {"type": "function", "function": {"name": "fetch", "description": "Fetch a URL", "parameters": params}}
    import localinfer

    with localinfer.load(str(smollm2_path), n_ctx=1024, n_threads=2) as model:
        r = model.chat([{"role": "user", "content": "Fetch https://example.com"}], tools=[tool, ADD],
                       tool_choice={"type": "function", "function": {"name": "fetch"}}, parallel_tool_calls=False,
                       temperature=0, max_tokens=96)  # fmt: skip
    assert r.tool_calls and r.finish_reason == "tool_calls"
    for call in r.tool_calls:
        args = json.loads(call.arguments)
        assert call.name == "fetch"
        # valid but for what the constraint leaves out (format, propertyNames, if/then: described to the
        # model, checked after the call): SmolLM2 writes {"type": ...} into env on some CPUs
        described = {**params["properties"], "url": {"type": "string"}, "env": {"type": "object", "maxProperties": 2}}
        jsonschema.validate(args, {**params, "if": {}, "then": {}, "properties": described})
        assert all(len(e["path"]) <= 20 for e in args["edits"]), "the $ref'd schema is enforced"
