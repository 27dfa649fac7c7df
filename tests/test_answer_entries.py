"""One request, every entry, one answer: `run --json`, `batch`, `run --keep-alive` (the resident
server) and serve's four protocols (OpenAI Chat Completions, Anthropic Messages, the Responses API,
Ollama's /api/chat) finish the same greedy request to the same finish reason (each wire's name for
it), the same usage (prompt and completion tokens), the same text and the same logprobs (the text's
tokens, where the wire has them), field by field: an answer is assembled once (``answer.finished``),
whoever asked.

Cases: cut by ``max_tokens``; ended by a stop string; a JSON-schema document a stop string cut
(``length`` on every entry: it does not parse). The Responses API has no stop field: it runs the first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import test_keepalive_handover as handover
from conftest import run_cli
from test_serve_model import ServeProcess

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]}
CASES = {
    "length": {"prompt": "Name three colours.", "max_tokens": 6},
    "stop": {"prompt": "Name three colours.", "max_tokens": 24, "stop": "colour"},
    "schema cut by a stop": {"prompt": "Extract: Marie Curie, 34", "max_tokens": 40, "stop": "age", "schema": SCHEMA},
}
# each wire's names for the finish reasons (docs/serve.md), as run --json says them
REASONS = {
    "anthropic": {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length"},
    "responses": {"completed": "stop", "incomplete": "length"},
}
# finish reason (run's name), prompt tokens, completion tokens, text, the logprobs' tokens (None: the wire has none)
Seen = tuple[str | None, int, int, str, tuple[str, ...] | None]
FIELDS = ("finish_reason", "prompt_tokens", "completion_tokens", "text", "logprobs")

home = handover.home  # a home whose resident server and runner are killed after the test


@pytest.fixture(scope="module")
def served(smollm2_path, tmp_path_factory):
    with ServeProcess(smollm2_path, "-np", "1", "-c", "1024", "-t", "1", home=tmp_path_factory.mktemp("entries-home")) as s:
        yield s


def _cli(case: dict[str, Any]) -> list[str]:
    args = ["--temp", "0", "-n", str(case["max_tokens"]), "-c", "1024", "-t", "1", "--logprobs", "0"]
    if "stop" in case:
        args += ["--stop", case["stop"]]
    if "schema" in case:
        args += ["--json-schema", json.dumps(case["schema"])]
    return args


def _run(model: Path, case: dict[str, Any], *extra: str, env: dict[str, str] | None = None) -> Seen:
    proc = run_cli("run", "-m", str(model), *_cli(case), "--json", *extra, case["prompt"], env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    a = json.loads(proc.stdout)
    return a["finish_reason"], a["usage"]["prompt_tokens"], a["usage"]["completion_tokens"], a["text"], _tokens(a["logprobs"])


def _tokens(entries: list[dict[str, Any]]) -> tuple[str, ...]:
    return tuple(e["token"] for e in entries)


def _batch(model: Path, tmp_path: Path) -> dict[str, Seen]:
    lines = []
    for name, case in CASES.items():
        line: dict[str, Any] = {"id": name, "prompt": case["prompt"], "max_tokens": case["max_tokens"], "logprobs": 0}
        if "stop" in case:
            line["stop"] = [case["stop"]]
        if "schema" in case:
            line["response_format"] = {"type": "json_schema", "json_schema": {"name": "p", "schema": case["schema"]}}
        lines.append(json.dumps(line))
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    proc = run_cli("batch", str(src), "-m", str(model), "--temperature", "0", "-c", "1024", "-t", "1", "-q")
    assert proc.returncode == 0, proc.stderr.decode()
    out = [json.loads(ln) for ln in proc.stdout.decode().splitlines() if ln.strip()]
    return {o["id"]: (o["finish_reason"], o["usage"]["prompt_tokens"], o["usage"]["completion_tokens"], o["text"],
                      _tokens(o["logprobs"])) for o in out}  # fmt: skip


def _post(s: ServeProcess, path: str, body: dict[str, Any]) -> Any:
    status, got = s.json("POST", path, body)
    assert status == 200, got
    return got


def _messages(case: dict[str, Any], stop: str) -> dict[str, Any]:
    """OpenAI's and Anthropic's common body (``stop``: the stop strings' field)."""
    body = {"model": "m", "messages": [{"role": "user", "content": case["prompt"]}], "temperature": 0, "max_tokens": case["max_tokens"]}
    return {**body, stop: [case["stop"]]} if "stop" in case else body


def _openai(s: ServeProcess, case: dict[str, Any]) -> Seen:
    body = {**_messages(case, "stop"), "logprobs": True, "top_logprobs": 0}
    if "schema" in case:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "p", "schema": case["schema"]}}
    a = _post(s, "/v1/chat/completions", body)
    choice = a["choices"][0]
    u = a["usage"]
    return choice["finish_reason"], u["prompt_tokens"], u["completion_tokens"], choice["message"]["content"], _tokens(choice["logprobs"]["content"])


def _anthropic(s: ServeProcess, case: dict[str, Any]) -> Seen:
    body = _messages(case, "stop_sequences")
    if "schema" in case:
        body["output_format"] = {"type": "json_schema", "schema": case["schema"]}
    a = _post(s, "/v1/messages", body)
    u = a["usage"]
    text = "".join(c["text"] for c in a["content"] if c["type"] == "text")
    return (REASONS["anthropic"].get(a["stop_reason"], a["stop_reason"]), u["input_tokens"] + u["cache_read_input_tokens"],
            u["output_tokens"], text, None)  # fmt: skip


def _responses(s: ServeProcess, case: dict[str, Any]) -> Seen:
    body: dict[str, Any] = {"model": "m", "input": case["prompt"], "temperature": 0, "max_output_tokens": case["max_tokens"]}
    if "schema" in case:
        body["text"] = {"format": {"type": "json_schema", "name": "p", "schema": case["schema"]}}
    a = _post(s, "/v1/responses", body)
    text = "".join(p["text"] for item in a["output"] if item["type"] == "message" for p in item["content"])
    u = a["usage"]
    return REASONS["responses"].get(a["status"], a["status"]), u["input_tokens"], u["output_tokens"], text, None


def _ollama(s: ServeProcess, case: dict[str, Any]) -> Seen:
    options: dict[str, Any] = {"temperature": 0, "num_predict": case["max_tokens"]}
    if "stop" in case:
        options["stop"] = [case["stop"]]
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": case["prompt"]}], "stream": False,
                            "options": options, "logprobs": True}  # fmt: skip
    if "schema" in case:
        body["format"] = case["schema"]
    a = _post(s, "/api/chat", body)
    return a["done_reason"], a["prompt_eval_count"], a["eval_count"], a["message"]["content"], _tokens(a["logprobs"])


WIRES = {"serve openai": _openai, "serve anthropic": _anthropic, "serve responses": _responses, "serve ollama": _ollama}


def test_every_entry_finishes_one_request_to_the_same_answer(smollm2_path, served, home, tmp_path):
    env = {"LOCALINFER_HOME": str(home)}
    batch = _batch(smollm2_path, tmp_path)
    differ = []
    for name, case in CASES.items():
        seen: dict[str, Seen] = {"run --json": _run(smollm2_path, case), "batch": batch[name],
                                 "run --keep-alive": _run(smollm2_path, case, "--keep-alive", "60s", env=env)}  # fmt: skip
        for wire, ask in WIRES.items():
            if wire == "serve responses" and "stop" in case:
                continue  # the Responses API takes no stop strings
            seen[wire] = ask(served, case)
        want = ("stop" if name == "stop" else "length", *seen["run --json"][1:])  # the reason every entry must say
        for entry, got in seen.items():
            for field, a, b in zip(FIELDS, want, got):
                if a != b and b is not None:
                    differ.append(f"{name}: {entry}'s {field} is {b!r}, not {a!r}")
    assert not differ, "\n".join(differ)
