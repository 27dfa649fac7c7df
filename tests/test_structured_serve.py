"""Structured output from a real `localinfer serve` (SmolLM2 on 127.0.0.1), asked by the official
``openai`` client: ``chat.completions.parse`` with pydantic models, json_object and json_schema,
streamed and not, several schemas at once; every answer validated with ``jsonschema``. Bad schemas
are 400s naming what is wrong, and the server serves on after them."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, Optional

import pytest

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pydantic = pytest.importorskip("pydantic")

from test_serve_model import ServeProcess  # noqa: E402

Field = pydantic.Field


class Address(pydantic.BaseModel):
    city: str = Field(max_length=24)
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Person(pydantic.BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=130)
    mood: Literal["happy", "sad", "neutral"]
    nickname: Optional[str] = Field(max_length=16)
    address: Address


# The corpus: realistic schemas a client sends (strict shapes: every property required).
SCHEMAS = {
    "classify": {"type": "object", "properties": {"label": {"enum": ["spam", "ham", "unsure"]},
                 "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
                 "required": ["label", "confidence"], "additionalProperties": False},
    "invoice": {"type": "object", "properties": {
        "number": {"type": "string", "pattern": "^INV-[0-9]{4}$"},
        "date": {"type": "string", "format": "date"},
        "lines": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"$ref": "#/$defs/line"}}},
        "required": ["number", "date", "lines"], "additionalProperties": False,
        "$defs": {"line": {"type": "object", "properties": {"item": {"type": "string", "maxLength": 20},
                  "qty": {"type": "integer", "minimum": 1, "maximum": 99}}, "required": ["item", "qty"],
                  "additionalProperties": False}}},
    "shape": {"anyOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1, "maximum": 9}},
         "required": ["kind", "r"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1, "maximum": 9}},
         "required": ["kind", "side"], "additionalProperties": False}]},
    "tags": {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
             "minItems": 2, "maxItems": 4}, "note": {"type": ["string", "null"], "maxLength": 30}},
             "required": ["tags", "note"], "additionalProperties": False},
}  # fmt: skip
ASK = {
    "classify": "Is 'WIN A FREE CRUISE NOW' spam? Answer in JSON.",
    "invoice": "Write a small invoice for two pencils and one notebook, in JSON.",
    "shape": "Describe a circle of radius 3 as JSON.",
    "tags": "Give tags for a blog post about baking bread, in JSON.",
}
MAX = 160  # every schema above fits well within this many tokens


def rf(name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


def messages(name: str) -> list[dict]:
    return [{"role": "user", "content": ASK[name]}]


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    with ServeProcess(smollm2_path, "-np", "4", "-c", "1024", home=tmp_path_factory.mktemp("structured-home")) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0)


def streamed_text(stream) -> tuple[str, str | None]:
    text, finish = [], None
    for chunk in stream:
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(text), finish


def test_parse_with_a_pydantic_model_gives_an_instance(client):
    completion = client.chat.completions.parse(
        model="smollm2", messages=[{"role": "user", "content": "Invent a person who lives in Paris."}],
        response_format=Person, temperature=0, max_tokens=200,
    )  # fmt: skip
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop", message.content
    assert isinstance(message.parsed, Person) and isinstance(message.parsed.address, Address)
    jsonschema.validate(json.loads(message.content), Person.model_json_schema())


@pytest.mark.parametrize("temperature", [0, 0.8])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_every_schema_of_the_corpus_is_obeyed(client, stream, temperature):
    for name, schema in SCHEMAS.items():
        kw = dict(model="smollm2", messages=messages(name), response_format=rf(name), temperature=temperature,
                  max_tokens=MAX, seed=7)  # fmt: skip
        if stream:
            text, finish = streamed_text(client.chat.completions.create(stream=True, **kw))
        else:
            choice = client.chat.completions.create(**kw).choices[0]
            text, finish = choice.message.content, choice.finish_reason
        assert finish == "stop", (name, text)
        jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_json_object_mode_answers_an_object(client, stream):
    kw = dict(model="smollm2", messages=[{"role": "user", "content": "List three fruits as JSON."}],
              response_format={"type": "json_object"}, temperature=0, max_tokens=MAX)  # fmt: skip
    if stream:
        text, finish = streamed_text(client.chat.completions.create(stream=True, **kw))
    else:
        choice = client.chat.completions.create(**kw).choices[0]
        text, finish = choice.message.content, choice.finish_reason
    if finish == "stop":
        assert isinstance(json.loads(text), dict), text
    else:  # an object the model kept growing: cut, and said so
        assert finish == "length" and text.lstrip().startswith("{"), (finish, text)


def test_four_schemas_decode_together(client):
    def ask(name: str) -> tuple[str, str, str]:
        choice = client.chat.completions.create(model="smollm2", messages=messages(name), response_format=rf(name),
                                                temperature=0.8, max_tokens=MAX).choices[0]  # fmt: skip
        return name, choice.message.content, choice.finish_reason

    with ThreadPoolExecutor(4) as pool:
        for name, text, finish in pool.map(ask, list(SCHEMAS)):
            assert finish == "stop", (name, text)
            jsonschema.validate(json.loads(text), SCHEMAS[name])


def test_completions_take_llama_servers_json_schema_and_grammar(client, server):
    out = client.completions.create(model="smollm2", prompt="Rate this movie from 1 to 9:", max_tokens=MAX,
                                    temperature=0, extra_body={"json_schema": SCHEMAS["shape"]})  # fmt: skip
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].text), SCHEMAS["shape"])
    stream = client.completions.create(model="smollm2", prompt="Is the sky green? Answer:", max_tokens=8, stream=True,
                                       temperature=0.8, extra_body={"grammar": 'root ::= " yes" | " no"'})  # fmt: skip
    assert "".join(c.choices[0].text for c in stream if c.choices) in (" yes", " no")
    status, body = server.json("POST", "/v1/chat/completions", {"messages": messages("classify"), "max_tokens": MAX,
                                                                 "json_schema": SCHEMAS["classify"], "temperature": 0})  # fmt: skip
    assert status == 200
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), SCHEMAS["classify"])


def test_a_document_cut_by_max_tokens_finishes_with_length(client):
    choice = client.chat.completions.create(model="smollm2", messages=messages("invoice"), response_format=rf("invoice"),
                                            temperature=0, max_tokens=4).choices[0]  # fmt: skip
    assert choice.finish_reason == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice.message.content)
    cut = client.chat.completions.create(model="smollm2", messages=messages("classify"), response_format=rf("classify"),
                                         temperature=0, max_tokens=MAX, stop=[","]).choices[0]  # fmt: skip
    assert cut.finish_reason == "length" and "," not in cut.message.content, cut  # a stop string inside the document
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(model="smollm2", messages=messages("classify"), response_format=Person, max_tokens=4)


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
          "patternProperties": {"^a": {}}}}}}, "response_format.json_schema.schema", "patternProperties"),  # fmt: skip
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/nope"}}}},
         "response_format.json_schema.schema", "#/$defs/nope"),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "yaml"),
        ({"json_schema": {"type": "string", "minLength": 5, "maxLength": 2}}, "json_schema", "minLength"),
        ({"grammar": "root ::= ( unclosed"}, "grammar", "grammar"),
    ],
)
def test_bad_schemas_are_400s_naming_what_is_wrong_and_serving_goes_on(client, extra, param, words):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="smollm2", messages=messages("classify"), max_tokens=8, extra_body=extra)
    err = info.value.body
    assert info.value.status_code == 400 and err["param"] == param and err["type"] == "invalid_request_error", err
    assert words in err["message"], err
    ok = client.chat.completions.create(model="smollm2", messages=messages("classify"), response_format=rf("classify"),
                                        max_tokens=MAX, temperature=0).choices[0]  # fmt: skip
    jsonschema.validate(json.loads(ok.message.content), SCHEMAS["classify"])
