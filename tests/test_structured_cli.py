"""`run --json-schema / --grammar / --format json`: checked before anything loads, sent to a server
with --endpoint, and on a real model stdout is exactly the document."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import jsonschema
import pytest
from conftest import run_cli
from stubserver import StubServer
from structured_corpus import CORPUS
from typer.testing import CliRunner

from localinfer.cli.main import build_app

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30}}, "required": ["name"],
          "additionalProperties": False}  # fmt: skip


def cli(*args: str):
    return CliRunner().invoke(build_app(), list(args))


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--json-schema", '{"type": "object", "not": {}}'], "keyword 'not' is not supported"),
        (["--json-schema", '{"$ref": "#/$defs/gone"}'], "points to nothing"),
        (["--json-schema", "{oops"], "not valid JSON"),
        (["--grammar", 'root ::= "a" | b'], "not valid GBNF"),
        (["--grammar", 'start ::= "a"'], "no 'root"),
        (["--format", "yaml"], "--format takes json"),
        (["--format", "json", "--grammar", 'root ::= "a"'], "--grammar, --format"),
        (["--json-schema-file", "/nonexistent/schema.json"], "cannot read /nonexistent/schema.json"),
    ],
)
@pytest.mark.llama
def test_bad_format_is_exit_2_before_the_model_is_looked_up(flags, words):
    res = cli("run", "-m", "/nonexistent/model.gguf", "hello", *flags)  # a missing model would be exit 3
    assert res.exit_code == 2, res.output
    assert words in res.stderr
    assert res.stdout == ""
    assert "Traceback" not in res.stderr


@pytest.fixture
def stub(monkeypatch):
    for name in ("LOCALINFER_ENDPOINT", "LOCALINFER_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with StubServer(tokens=4) as s:
        yield s


def test_endpoint_gets_response_format_or_grammar(stub, tmp_path):
    schema_file = tmp_path / "person.json"
    schema_file.write_text(json.dumps(PERSON))
    res = cli("run", "--endpoint", stub.url, "-p", "hi", "--json-schema-file", str(schema_file))
    assert res.exit_code == 0, res.output
    rf = stub.bodies[-1]["response_format"]
    assert rf == {"type": "json_schema", "json_schema": {"name": "schema", "schema": PERSON, "strict": True}}
    assert cli("run", "--endpoint", stub.url, "-p", "hi", "--format", "json").exit_code == 0
    assert stub.bodies[-1]["response_format"] == {"type": "json_object"}
    assert cli("run", "--endpoint", stub.url, "-p", "hi", "--grammar", 'root ::= "x"').exit_code == 0
    assert stub.bodies[-1]["grammar"] == 'root ::= "x"' and "response_format" not in stub.bodies[-1]
    assert cli("run", "--endpoint", stub.url, "-p", "hi").exit_code == 0
    assert "response_format" not in stub.bodies[-1] and "grammar" not in stub.bodies[-1]


# Every document of this schema is short (enums, a boolean, bounded integers and strings), so greedy
# decoding completes it within -n 300 on any CPU; the corpus's invoice bounds no number's digits and
# loops on some (the engine tests cover it).
BOUNDED_INVOICE = {
    "type": "object",
    "properties": {
        "invoice_number": {"type": "string", "maxLength": 16},
        "currency": {"enum": ["EUR", "USD", "GBP"]},
        "lines": {"type": "integer", "minimum": 1, "maximum": 99},
        "paid": {"type": "boolean"},
    },
    "required": ["invoice_number", "currency", "lines", "paid"],
    "additionalProperties": False,
}


@pytest.mark.slow
def test_run_stdout_is_exactly_the_document(smollm2_path):
    schema, prompt = BOUNDED_INVOICE, CORPUS["invoice"][1]
    proc = run_cli("run", "-m", str(smollm2_path), "--temperature", "0", "-n", "300", "--json-schema", json.dumps(schema), prompt)
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode()
    doc = json.loads(out)
    jsonschema.validate(doc, schema)
    # nothing before or after the document (json.loads also refuses trailing text), one final newline
    assert out.startswith("{") and out.endswith("}\n") and not out.endswith("\n\n")
    assert b"incomplete" not in proc.stderr


@pytest.mark.slow
def test_run_pipes_into_jq(smollm2_path):
    schema, prompt = CORPUS["classification"]
    cmd = (f"{shlex.quote(sys.executable)} -m localinfer run -q -m {shlex.quote(str(smollm2_path))} --temperature 0 "
           f"--json-schema {shlex.quote(json.dumps(schema))} {shlex.quote(prompt)} | jq -r .sentiment")  # fmt: skip
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() in schema["properties"]["sentiment"]["enum"]


@pytest.mark.slow
def test_truncated_document_says_so_and_exits_0(smollm2_path):
    schema, prompt = CORPUS["invoice"]
    proc = run_cli("run", "-m", str(smollm2_path), "--temperature", "0", "-n", "6", "--json-schema", json.dumps(schema), prompt)
    assert proc.returncode == 0, proc.stderr.decode()
    assert "the JSON is incomplete" in proc.stderr.decode()
    with pytest.raises(json.JSONDecodeError):
        json.loads(proc.stdout)
