"""The Format value: OpenAI's response_format, schemas and grammars, checked before anything loads."""

from __future__ import annotations

import pytest

from localinfer.request import structured
from localinfer.errors import ExitCode, UsageError, exit_code_for
from localinfer.request.request import build
from localinfer.request.structured import Format, FormatError, from_grammar, from_response_format, from_schema, pick

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name"]}


def test_response_format_shapes():
    assert from_response_format({"type": "text"}) is None
    assert from_response_format({"type": "json_object"}) == Format("json")
    f = from_response_format({"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}})
    assert f.kind == "json_schema" and f.name == "p" and f.strict and f.schema == PERSON
    # key order is kept: it is the order the answer's keys follow
    assert list(f.schema["properties"]) == ["name", "age"]
    assert f.to_response_format()["json_schema"]["schema"] == PERSON
    assert from_schema(f.text, name="p") == from_schema(PERSON, name="p") == f  # text or mapping: the same value
    assert hash(f) == hash(from_schema(PERSON, name="p"))


@pytest.mark.parametrize(
    "obj, words",
    [
        ({"type": "xml"}, "'xml'"),
        ("json", "must be an object"),
        ({"type": "json_schema"}, "'schema'"),
        ({"type": "json_schema", "json_schema": {"schema": PERSON, "name": 3}}, "name"),
    ],
)
def test_bad_response_format_is_named(obj, words):
    with pytest.raises(FormatError, match=words):
        from_response_format(obj)


@pytest.mark.parametrize(
    "schema, words",
    [
        ({"type": "object", "patternProperties": {"x": {}}}, "'patternProperties' is not supported"),
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "'uniqueItems' is not supported"),
        ({"properties": {"a": {"not": {"type": "string"}}}}, "#/properties/a: JSON Schema keyword 'not'"),
        ({"if": {}, "then": {}}, "'if'"),
        ({"$ref": "#/$defs/missing"}, "'#/\\$defs/missing' points to nothing"),
        ({"$ref": "https://example.com/s.json"}, "only local"),
        ({"type": "strin"}, "unknown type 'strin'"),
        ({"type": "string", "format": "credit-card"}, "format 'credit-card' is not supported"),
        ({"type": "string", "pattern": "(?=a)b"}, "lookaround"),
        ({"type": "string", "pattern": "(a)\\1"}, "backreference"),
        ({"type": "string", "pattern": "[a-"}, "not a valid regular expression"),
        ({"type": "array", "minItems": 3, "maxItems": 2}, "'minItems' is larger than 'maxItems'"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "nothing can satisfy"),
        ({"type": "string", "minLength": -1}, "non-negative"),
        ({"enum": []}, "'enum' must be a non-empty list"),
        ({"required": "name"}, "'required' must be a list"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (False, "nothing can satisfy"),
    ],
)
def test_schema_refused_by_name(schema, words):
    with pytest.raises(FormatError, match=words) as info:
        from_schema(schema)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, UsageError) and exit_code_for(info.value) == ExitCode.USAGE


def test_recursive_ref_and_annotations_are_fine():
    tree = {
        "$defs": {"node": {"type": "object", "title": "Node", "description": "a node",
                           "properties": {"v": {"type": "integer"},
                                          "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node",
    }  # fmt: skip
    assert from_schema(tree).schema == tree


def test_too_large_or_too_deep_is_refused():
    deep: dict = {"type": "string"}
    for _ in range(structured.MAX_SCHEMA_DEPTH + 2):
        deep = {"type": "array", "items": deep}
    with pytest.raises(FormatError, match="deeper than"):
        from_schema(deep)
    with pytest.raises(FormatError, match="larger than"):
        from_schema('{"description": "' + "x" * structured.MAX_SCHEMA_BYTES + '"}')


def test_grammar_checks():
    assert from_grammar('root ::= "yes" | "no"').kind == "grammar"
    with pytest.raises(FormatError, match="no 'root"):
        from_grammar('answer ::= "yes"')
    with pytest.raises(FormatError, match="empty"):
        from_grammar("  ")
    with pytest.raises(FormatError, match="not valid GBNF.*'nope' not found"):
        from_grammar('root ::= "a" nope')
    with pytest.raises(FormatError, match="not valid GBNF"):
        from_grammar('root ::= "unterminated')


def test_pick_and_build():
    assert pick() is None
    assert pick("json") == Format("json")
    assert pick(json_schema=PERSON).kind == "json_schema"
    assert pick(grammar='root ::= "a"').text == 'root ::= "a"'
    with pytest.raises(FormatError, match="json_schema and grammar"):
        pick(json_schema=PERSON, grammar='root ::= "a"')
    assert build("hi").response_format is None
    assert build("hi", json_schema=PERSON).response_format == from_schema(PERSON)
    assert build("hi", response_format={"type": "json_object"}).response_format == Format("json")
