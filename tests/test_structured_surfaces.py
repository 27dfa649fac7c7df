"""Structured output through serve's protocol, batch lines and chat's `/set format`, without a model:
what each surface accepts, the Format it hands on, and the one-line refusals naming what is wrong."""

from __future__ import annotations

import json

import pytest

from localinfer.batch.io import parse_input
from localinfer.chat.settings import ChatSettings
from localinfer.errors import UsageError
from localinfer.request.request import InputError

pytest.importorskip("starlette")

from localinfer.serve.wires.openai import ApiError, parse_request

HI = [{"role": "user", "content": "hi"}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"], "additionalProperties": False}  # fmt: skip


# -- serve ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, main", [("chat", {"messages": HI}), ("text", {"prompt": "x"})])
def test_serve_takes_every_way_to_ask_for_structure_on_both_endpoints(kind, main):
    schema_rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    r = parse_request({**main, "response_format": schema_rf}, kind).request
    assert (r.response_format.kind, r.response_format.name, r.response_format.schema) == ("json_schema", "person", PERSON)
    assert parse_request({**main, "response_format": {"type": "json_object"}}, kind).request.response_format.kind == "json"
    assert parse_request({**main, "response_format": {"type": "text"}}, kind).request.response_format is None
    assert parse_request({**main, "json_schema": PERSON}, kind).request.response_format.schema == PERSON  # llama-server's
    g = parse_request({**main, "grammar": 'root ::= "yes" | "no"'}, kind).request.response_format
    assert (g.kind, g.text) == ("grammar", 'root ::= "yes" | "no"')
    assert parse_request(main, kind).request.response_format is None


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"response_format": {"type": "xml"}}, "response_format.type", "json_schema"),
        ({"response_format": "json"}, "response_format", "must be an object"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema", "schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "propertyNames": {}}}}},
         "response_format.json_schema.schema", "propertyNames"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/$defs/missing"}}}},
         "response_format.json_schema.schema", "#/$defs/missing"),
        ({"response_format": {"type": "json_object", "strict": True}}, "response_format", "'strict'"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "stric": True}}}, "response_format", "json_schema.stric"),
        ({"json_schema": "not a schema"}, "json_schema", "must be a JSON schema"),
        ({"json_schema": {"type": "object", "minProperties": 1}}, "json_schema", "minProperties"),
        ({"grammar": ""}, "grammar", "empty"),
        ({"grammar": 'start ::= "x"'}, "grammar", "root"),
        ({"grammar": 'root ::= "x"', "json_schema": {}}, "grammar", "give one"),
    ],
)
def test_serve_refuses_a_format_it_cannot_enforce_by_name(extra, param, words):
    for kind, main in (("chat", {"messages": HI}), ("text", {"prompt": "x"})):
        with pytest.raises(ApiError) as info:
            parse_request({**main, **extra}, kind)
        err = info.value
        assert err.status == 400 and err.param == param, err.body()
        assert words in err.message, err.message


# -- batch lines ------------------------------------------------------------------------------------------
def test_a_batch_line_brings_its_own_format_or_turns_the_commands_off():
    rf = json.dumps({"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}})
    lines = "\n".join([
        '{"id": "a", "prompt": "x", "response_format": ' + rf + "}",
        '{"id": "b", "prompt": "x", "response_format": {"type": "json_object"}}',
        '{"id": "c", "prompt": "x", "response_format": {"type": "text"}}',
        '{"id": "d", "prompt": "x"}',
        '{"id": "e", "prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}}',
    ])  # fmt: skip
    a, b, c, d, e = parse_input(lines, "jsonl")
    assert a.response_format.schema == PERSON and b.response_format.kind == "json"
    assert c.response_format is False and d.response_format is None  # free text / the command's
    assert isinstance(e, InputError) and e.id == "e" and "'nope'" in e.reason and "response_format" in e.reason


def test_the_line_overrides_the_commands_format():
    from localinfer.request import structured
    from localinfer.batch.job import BatchDefaults, to_request

    class Chat:
        name, can_chat = "m", True

    command = BatchDefaults(response_format=structured.from_schema(PERSON))
    a, c, d = parse_input('{"prompt": "x", "response_format": {"type": "json_object"}}\n'
                          '{"prompt": "x", "response_format": {"type": "text"}}\n{"prompt": "x"}', "jsonl")  # fmt: skip
    assert to_request(a, command, Chat()).response_format.kind == "json"
    assert to_request(c, command, Chat()).response_format is None
    assert to_request(d, command, Chat()).response_format.schema == PERSON


# -- chat -------------------------------------------------------------------------------------------------
def test_set_format_json_schema_grammar_and_off(tmp_path):
    schema, grammar = tmp_path / "person.json", tmp_path / "yesno.gbnf"
    schema.write_text(json.dumps(PERSON))
    grammar.write_text('root ::= "yes" | "no"\n')
    s = ChatSettings().with_value("format", "json")
    assert s.response_format.kind == "json" and dict(s.items())["format"].startswith("json")
    s = s.with_value("format", f"schema {schema}")
    assert s.response_format.schema == PERSON and dict(s.items())["format"] == "schema person"
    s = s.with_value("format", f"grammar {grammar}")
    assert s.response_format.kind == "grammar" and s.response_format.text.startswith("root ::=")
    assert s.with_value("format", "off").response_format is None


def test_set_format_refuses_in_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "object", "patternProperties": {}}')
    for value, words in (("yaml", "json, schema FILE"), (f"schema {tmp_path / 'missing.json'}", "cannot read"),
                         (f"schema {bad}", "patternProperties"), ("schema", "json, schema FILE")):  # fmt: skip
        with pytest.raises(UsageError, match=words):
            ChatSettings().with_value("format", value)
