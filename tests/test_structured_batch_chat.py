"""Structured output from `batch` and `chat` through the real entry point, on SmolLM2: a schema per
batch line (and the command's for the others) decoded four at a time, every answer validated with
``jsonschema``; and `/set format` in the chat REPL, driven in a pseudo-terminal."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

pytestmark = pytest.mark.slow
jsonschema = pytest.importorskip("jsonschema")

COLOR = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "hex": {"type": "string",
         "pattern": "^#[0-9a-f]{6}$"}}, "required": ["color", "hex"], "additionalProperties": False}  # fmt: skip
POINT = {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
         "y": {"type": "integer", "minimum": -9, "maximum": 9}}, "required": ["x", "y"], "additionalProperties": False}  # fmt: skip
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "founded": {"type": ["integer", "null"],
        "minimum": 0, "maximum": 2100}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
        "minItems": 1, "maxItems": 3}}, "required": ["city", "founded", "tags"], "additionalProperties": False}  # fmt: skip
DATE = {"type": "object", "properties": {"event": {"type": "string", "maxLength": 30}, "on": {"type": "string", "format": "date"}},
        "required": ["event", "on"], "additionalProperties": False}  # fmt: skip


def rf(name: str, schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@pytest.mark.parametrize("temperature", ["0", "0.8"])
def test_batch_parallel_4_with_a_schema_per_line(smollm2_path, tmp_path, temperature):
    command_schema = tmp_path / "date.json"
    command_schema.write_text(json.dumps(DATE))
    lines = [
        {"id": "color", "prompt": "Pick a color, as JSON.", "response_format": rf("color", COLOR)},
        {"id": "point", "prompt": "Give a point on a grid, as JSON.", "response_format": rf("point", POINT)},
        {"id": "city", "messages": [{"role": "user", "content": "Describe Paris as JSON."}], "response_format": rf("city", CITY)},
        {"id": "any", "prompt": "Describe a cat as a JSON object.", "response_format": {"type": "json_object"}},
        {"id": "date", "prompt": "When did the first moon landing happen? JSON."},  # the command's --json-schema-file
        {"id": "text", "prompt": "Say hi.", "response_format": {"type": "text"}, "max_tokens": 8},
        {"id": "bad", "prompt": "x", "response_format": rf("bad", {"type": "object", "unevaluatedProperties": False})},
    ]  # fmt: skip
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    res = run_cli("batch", str(src), "-m", str(smollm2_path), "--parallel", "4", "-c", "512", "-t", "1", "--offline",
                  "--temperature", temperature, "--seed", "3", "--max-tokens", "160", "--json-schema-file", str(command_schema),
                  "--no-log", "-q")  # fmt: skip
    assert res.returncode == 0, res.stderr.decode()  # --on-error skip: the bad line is a record, the rest run
    records = {r["id"]: r for r in map(json.loads, res.stdout.decode().splitlines())}
    assert set(records) == {line["id"] for line in lines}, res.stderr.decode()
    assert "unevaluatedProperties" in records["bad"]["error"] and "text" not in records["bad"]
    for name, schema in (("color", COLOR), ("point", POINT), ("city", CITY), ("date", DATE)):
        assert records[name]["finish_reason"] == "stop", records[name]
        jsonschema.validate(json.loads(records[name]["text"]), schema)
    free = records["any"]  # any object: a small model may grow it until -n cuts it, which it then says
    assert isinstance(json.loads(free["text"]), dict) if free["finish_reason"] == "stop" else free["text"].startswith("{")
    assert free["finish_reason"] in ("stop", "length")
    with pytest.raises(ValueError):  # free text: not the command's JSON
        json.loads(records["text"]["text"])


def test_chat_repl_set_format_schema_then_off(smollm2_path, tmp_path):
    from test_chat_cli import Repl

    schema = tmp_path / "point.json"
    schema.write_text(json.dumps(POINT))
    repl = Repl(smollm2_path, "--temperature", "0", "-c", "1024", "-n", "96", "--no-log")
    try:
        seen = repl.command(f"/set format schema {schema}", r"Set format = schema point\.")
        assert "Set format = schema point." in seen
        answer, _ = repl.turn("Where is the treasure on the map?")
        jsonschema.validate(json.loads(answer), POINT)
        seen = repl.command("/set format yaml", "takes json, schema FILE, grammar FILE or off, not 'yaml'")
        assert "Error: /set format takes json" in seen
        repl.command("/set format json", r"Set format = json")
        answer, _ = repl.turn("And a second one?")
        assert isinstance(json.loads(answer), dict)
        repl.command("/set format off", r"Set format = off")
        repl.command("/clear", "New conversation")  # else the model goes on imitating its JSON answers
        answer, _ = repl.turn("Say hello in one short sentence.")
        with pytest.raises(ValueError):
            json.loads(answer)
        repl.child.sendline("/exit")
        assert repl.finish() == 0
    finally:
        repl.child.close(force=True)


def test_chat_piped_with_json_schema_flag(smollm2_path):
    res = run_cli("chat", "-m", str(smollm2_path), "-t", "1", "-c", "1024", "--temperature", "0", "-n", "96", "--offline",
                  "--no-log", "-q", "--json-schema", json.dumps(POINT), input="Give me a point.\nAnother one.\n")  # fmt: skip
    assert res.returncode == 0, res.stderr.decode()
    answers = [line for line in res.stdout.decode().splitlines() if line.strip()]
    assert len(answers) == 2
    for a in answers:
        jsonschema.validate(json.loads(a), POINT)
