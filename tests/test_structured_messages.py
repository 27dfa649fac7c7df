"""Issue 40: a format we cannot enforce is named by where it was given (the option, the batch line's
field, the request field), and tools with a format are refused on every surface unless no call can
be made (``tool_choice: none``). No model: the checks run before anything loads."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from localinfer.request import request as rq
from localinfer.batch.io import parse_input
from localinfer.cli.main import build_app
from localinfer.errors import UsageError
from localinfer.request.request import InputError
from localinfer.serve.wires.openai import ApiError, parse_request

DANGLING = {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
HI = [{"role": "user", "content": "hi"}]


@pytest.mark.llama  # the CLI loads llama.cpp's bindings on its way to the format check
@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--json-schema", json.dumps(DANGLING), "'#/nowhere' points to nothing"),
        ("--json-schema-file", "SCHEMA", "'#/nowhere' points to nothing"),
        ("--grammar", "root ::= foo", "not valid GBNF"),
        ("--grammar-file", "GRAMMAR", "no 'root"),
    ],
)
def test_the_cli_names_the_option_like_typer(tmp_path, flag, value, words):
    files = {"SCHEMA": json.dumps(DANGLING), "GRAMMAR": 'start ::= "a"'}
    if value in files:
        (tmp_path / "f").write_text(files[value])
        value = str(tmp_path / "f")
    res = CliRunner().invoke(build_app(), ["run", "-m", "/nonexistent/model.gguf", "hello", flag, value])
    assert res.exit_code == 2, res.output
    assert f"Invalid value for '{flag}': " in res.stderr and words in res.stderr, res.stderr


def test_chat_set_format_names_itself(tmp_path):
    from localinfer.chat.settings import ChatSettings

    (tmp_path / "s.json").write_text(json.dumps(DANGLING))
    with pytest.raises(UsageError, match=r"^Invalid value for '/set format schema': #/properties/a: .* points to nothing"):
        ChatSettings().with_value("format", f"schema {tmp_path / 's.json'}")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": DANGLING}}},
         "response_format.json_schema.schema"),
        ({"response_format": {"type": "json_object", "schema": DANGLING}}, "response_format.schema"),  # llama-server's
        ({"json_schema": DANGLING}, "json_schema"),
        ({"grammar": "root ::= foo"}, "grammar"),
    ],
)  # fmt: skip
def test_serve_and_batch_name_the_field_that_holds_the_schema(fields, param):
    with pytest.raises(ApiError) as info:
        parse_request({"messages": HI, **fields}, "chat")
    assert info.value.status == 400 and info.value.param == param, info.value.body()
    assert info.value.message.startswith(f"'{param}' cannot be enforced: "), info.value.message
    if "response_format" in fields:  # a batch line takes response_format only
        item = parse_input(json.dumps({"prompt": "x", **fields}), "jsonl")[0]
        assert isinstance(item, InputError) and item.reason.startswith(f"'{param}' cannot be enforced: "), item


SCHEMA_RF = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}


@pytest.mark.parametrize("choice", [None, "auto", "required", {"type": "function", "function": {"name": "f"}}])
def test_tools_with_a_format_are_refused_everywhere_naming_both(choice):
    given = {"tools": TOOLS, **({} if choice is None else {"tool_choice": choice})}
    for fmt in ({"response_format": SCHEMA_RF}, {"json_schema": {"type": "object"}}, {"grammar": 'root ::= "a"'}):
        with pytest.raises(ApiError) as info:
            parse_request({"messages": HI, **given, **fmt}, "chat")
        name = next(iter(fmt))
        assert info.value.status == 400 and info.value.param == name
        assert "'tools'" in info.value.message and f"'{name}'" in info.value.message
        with pytest.raises(UsageError, match="together with 'tools'"):
            rq.build("hi", **given, **fmt)
    item = parse_input(json.dumps({"prompt": "x", **given, "response_format": SCHEMA_RF}), "jsonl")[0]
    assert isinstance(item, InputError) and "together with 'tools'" in item.reason


def test_with_tool_choice_none_the_format_is_kept_and_enforced():
    req = parse_request({"messages": HI, "tools": TOOLS, "tool_choice": "none", "response_format": SCHEMA_RF}, "chat").request
    assert req.response_format is not None and req.response_format.kind == "json_schema"
    built = rq.build("hi", tools=TOOLS, tool_choice="none", response_format=SCHEMA_RF)
    assert built.response_format is not None and built.tool_choice.mode == "none"
    from localinfer.generate.prepare import constraint_for
    from localinfer.request.toolcalls.plan import plan_for

    plan = plan_for(built.tools, built.tool_choice, True, None)
    assert constraint_for(plan, built.response_format, None) == (built.response_format, None)
    assert parse_request({"messages": HI, "response_format": {"type": "text"}, "tools": TOOLS}, "chat").request.tools  # text: no format
