"""Issue 40: an integer or number the schema leaves unbounded is bounded for the constraint (16
integral digits, as llama.cpp's grammar; 10 fraction digits, no exponent), and an object that lists
its properties takes no others; the schema's own bounds win, and a schema the bound would break
compiles as given. Checked on llguidance's byte tokenizer (no model), then on SmolLM2, where the
issue's schema ran digits (or a key) until max_tokens."""

from __future__ import annotations

import json

import jsonschema
import pytest

from localinfer.request.structured import from_schema

POPULATION = {"type": "object", "properties": {"population": {"type": "integer"}}, "required": ["population"]}


def _compiler():
    import llguidance

    from localinfer.engine.constrain import Compiler

    return Compiler(llguidance.LLTokenizer("byte"), 256)  # llguidance's byte tokenizer for the model's


def accepts(schema: dict, text: str) -> bool:
    m = _compiler().compile(from_schema(schema)).matcher.deep_copy()
    m.consume_tokens(list(text.encode()))
    return not m.is_error() and m.is_accepting()


@pytest.mark.llama  # engine.constrain loads llama.cpp's bindings
@pytest.mark.parametrize(
    ("schema", "yes", "no"),
    [
        ({"type": "integer"}, ["0", "-12", "9" * 16, "-" + "9" * 16], ["9" * 17, "007", "1e3"]),
        ({"type": "number"}, ["1.5", "-0.0000000001", "9" * 16 + ".5"], ["1." + "1" * 11, "9" * 17, "1e5", "1.50000000000"]),
        ({"type": ["integer", "null"]}, ["null", "1" * 16], ["1" * 17]),
        ({"type": "integer", "minimum": 0}, ["0", "9" * 16], ["-1", "9" * 17]),  # its own minimum wins
        ({"type": "integer", "maximum": -5}, ["-5", "-" + "9" * 16], ["-4"]),
        ({"type": "integer", "minimum": 10**17}, [str(10**17), "9" * 18], ["9" * 19]),  # as many digits as its bound
        ({"type": "number", "minimum": 1e-12, "maximum": 2e-12}, ["0.0000000000015"], ["0.000000000003"]),  # finer than 10
        ({"type": "integer", "enum": [10**17]}, [str(10**17)], ["1"]),  # data, not a range: left alone
        ({"allOf": [{"type": "integer"}, {"minimum": 10**17}]}, [str(10**18)], ["1"]),  # compiled as given
        (POPULATION, ['{"population":12}'], ['{"population":12,"x":1}', '{"population":' + "1" * 17 + "}"]),
        ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True}, ['{"a":1,"b":2}'], []),
        ({"allOf": [{"type": "object", "properties": {"a": {"const": 1}}}, {"type": "object", "properties": {"b": {"const": 2}}}]},
         ['{"a":1,"b":2}'], []),  # an allOf branch's object is only part of the whole
        ({"$defs": {"Base": {"type": "object", "properties": {"a": {"const": 1}}}},
          "allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"b": {"const": 2}}, "required": ["b"]}]},
         ['{"a":1,"b":2}', '{"b":2}'], []),  # a part reached by $ref is only part of the whole too
        ({"$defs": {"Base": {"type": "object", "properties": {"a": {"const": 1}}}},
          "$ref": "#/$defs/Base", "properties": {"b": {"const": 2}}, "required": ["b"]},
         ['{"a":1,"b":2}'], []),  # so is one beside a $ref's siblings
    ],
)  # fmt: skip
def test_unbounded_numbers_and_keys_are_bounded_for_the_constraint_only(schema, yes, no):
    fmt = from_schema(schema)
    assert json.loads(fmt.text) == schema  # the schema the caller sees (and validates with) is as given
    for text in yes:
        assert accepts(schema, text), text
        jsonschema.validate(json.loads(text), schema)
    for text in no:
        assert not accepts(schema, text), text


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize(
    "schema",
    [POPULATION, {**POPULATION, "additionalProperties": False},
     {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "area_km2": {"type": "number"},
      "population": {"type": "integer"}}, "required": ["city", "area_km2", "population"]}],
)  # fmt: skip
def test_the_issues_schemas_end_with_a_valid_document_on_smollm2(smollm2_path, schema, temperature):
    import localinfer

    with localinfer.load(str(smollm2_path), n_ctx=1024) as model:
        for prompt in ("What is the population of France? Answer in JSON.", "Describe Paris in JSON."):
            r = model.generate(prompt, json_schema=schema, temperature=temperature, seed=3, max_tokens=200)
            assert r.finish_reason == "stop", r.text
            jsonschema.validate(json.loads(r.text), schema)
