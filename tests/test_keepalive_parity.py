"""A `--keep-alive` run is a plain run: the same stdout, exit code, warnings and `--json` (every key,
and no figure a plain run has lost on the way), for the answers whose parts a process boundary
could drop - a schema answer cut short, a context overflow, `--json`, a reasoning model's thinking -
and the same batch lines, tool calls included. The resident server sends each answer whole (``Answer.to_wire``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import test_keepalive_handover as handover
from conftest import run_cli
from reasoningmodel import R1_CHATML, with_template

pytestmark = pytest.mark.slow

SCHEMA = json.dumps({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                     "required": ["name", "age"]})  # fmt: skip

home = handover.home  # a home whose resident server and runner are killed after the test


def both(home: Path, *args: str) -> tuple:
    """A plain run and a `--keep-alive` one of ``args`` (after one that loads the model with the same
    flags, so that no load note differs), each as (exit code, stdout, warnings and errors)."""
    env = {"LOCALINFER_HOME": str(home)}
    run_cli(*args, "--keep-alive", "60s", env=env)
    out = []
    for extra in ((), ("--keep-alive", "60s")):
        proc = run_cli(*args, *extra, env=env)
        said = [ln for ln in proc.stderr.decode().splitlines() if ln.startswith(("warning:", "Error:", "  hint:"))]
        out.append((proc.returncode, proc.stdout.decode(), said, proc.stderr.decode()))
    return out[0], out[1]


def leaves(obj: object, path: str = "") -> dict[str, object]:
    if isinstance(obj, dict) and obj:
        return {k: v for key, value in obj.items() for k, v in leaves(value, f"{path}.{key}").items()}
    return {path: obj}


def same_json(plain: str, kept: str) -> tuple[dict, dict]:
    a, b = json.loads(plain), json.loads(kept)
    la, lb = leaves(a), leaves(b)
    assert set(la) == set(lb), set(la) ^ set(lb)
    lost = [k for k in la if (la[k] is None) != (lb[k] is None) and k != ".timings.load_ms"]
    assert not lost, {k: (la[k], lb[k]) for k in lost}
    if "error" in a:  # a batch line that failed: the same words (the hint included)
        assert a == b
    else:
        assert a["text"] == b["text"] and a["finish_reason"] == b["finish_reason"]
    return a, b


def test_a_schema_answer_cut_short_warns_the_same(home, smollm2_path):
    args = ("run", "-m", str(smollm2_path), "--temp", "0", "-n", "5", "-c", "1024", "--json-schema", SCHEMA,
            "Extract: Marie Curie, 34")  # fmt: skip
    plain, kept = both(home, *args)
    assert plain[:3] == kept[:3], kept[3]
    assert plain[0] == 0 and any("the JSON is incomplete" in w for w in kept[2])
    plain, kept = both(home, *args, "--json")
    assert plain[0] == kept[0] == 0 and plain[2] == kept[2], kept[3]
    a, b = same_json(plain[1], kept[1])
    assert b["timings"]["load_ms"] == 0 and a["seed"] is not None


def test_an_overflow_fails_the_same(home, smollm2_path):
    m = str(smollm2_path)
    for args in (("-n", "400", "Name a colour."), ("-n", "100", "word " * 300)):
        plain, kept = both(home, "run", "-m", m, "--temp", "0", "-c", "256", *args)
        assert plain[0] == kept[0] == 6 and plain[1:3] == kept[1:3], kept[3]
        assert kept[2][0].startswith("Error: ") and "context window (256 tokens)" in kept[2][0]


def test_json_and_logprobs_keep_every_figure(home, smollm2_path):
    plain, kept = both(home, "run", "-m", str(smollm2_path), "--temp", "0", "-n", "6", "-c", "1024", "--json",
                       "--logprobs", "2", "Name a colour.")  # fmt: skip
    assert plain[0] == kept[0] == 0 and plain[2] == kept[2] == []
    a, b = same_json(plain[1], kept[1])
    assert [e["token"] for e in a["logprobs"]] == [e["token"] for e in b["logprobs"]]
    assert b["offload"]["layers"] == a["offload"]["layers"] and b["context"]["n_ctx_train"] == a["context"]["n_ctx_train"]


def test_a_reasoning_answer_keeps_its_thinking(home, smollm2_path, tmp_path):
    r1 = str(with_template(smollm2_path, R1_CHATML, tmp_path / "smollm2-r1.gguf"))
    plain, kept = both(home, "run", "-m", r1, "--temp", "0", "-n", "40", "-c", "1024", "--json",
                       "What is the capital of Germany?")  # fmt: skip
    assert plain[0] == kept[0] == 0
    a, b = same_json(plain[1], kept[1])
    assert a["reasoning"] and b["reasoning"] == a["reasoning"]
    assert b["usage"]["reasoning_tokens"] == a["usage"]["reasoning_tokens"] > 0


def test_batch_lines_and_tool_calls_are_the_same(home, smollm2_path, tmp_path):
    from test_toolcalls_model import ADD, ASK

    reqs = tmp_path / "reqs.jsonl"
    lines = [{"id": "a", "prompt": "Name a colour."},
             {"id": "b", "prompt": "Extract: Marie Curie, 34", "response_format": {"type": "json_schema",
              "json_schema": {"name": "p", "schema": json.loads(SCHEMA)}}},
             {"id": "c", "messages": ASK, "tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "add"}}},
             {"id": "d", "prompt": "word " * 1200}]  # an overflow: the same error line  # fmt: skip
    reqs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    plain, kept = both(home, "batch", str(reqs), "-m", str(smollm2_path), "--temperature", "0", "-n", "48", "-c", "1024",
                       "--keep-order", "-q")  # fmt: skip
    assert plain[0] == kept[0] == 0, kept[3]
    for a_line, b_line in zip(plain[1].splitlines(), kept[1].splitlines(), strict=True):
        a, b = same_json(a_line, b_line)
        if a["id"] == "c":
            assert a["finish_reason"] == "tool_calls" and b["tool_calls"] == [
                {**c, "id": d["id"]} for c, d in zip(a["tool_calls"], b["tool_calls"], strict=True)]  # the ids are new


def test_an_image_crosses_to_the_resident_runner(home, smollm2_path, tmp_path):
    from projector import image_tokens, png, write_projector

    pulled = run_cli("pull", str(smollm2_path), "--name", "smolvis", "--mmproj", str(write_projector(tmp_path / "mmproj.gguf")),
                     env={"LOCALINFER_HOME": str(home)})  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr
    pic = tmp_path / "pic.png"
    pic.write_bytes(png(1))
    plain, kept = both(home, "run", "-m", "smolvis", "--image", str(pic), "--temp", "0", "-n", "8", "-c", "1024", "--json",
                       "What is in this picture?")  # fmt: skip
    assert plain[0] == kept[0] == 0 and plain[2] == kept[2] == [], kept[3]
    a, b = same_json(plain[1], kept[1])
    assert a["usage"]["image_tokens"] == b["usage"]["image_tokens"] == image_tokens()
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
    # the same file by its path, without the projector: the loaded vision model (one file, another
    # projector) does not answer it
    plain, kept = both(home, "run", "-m", str(smollm2_path), "--image", str(pic), "-n", "4", "-c", "1024", "hi")  # a text model
    assert plain[0] == kept[0] == 2 and plain[1:3] == kept[1:3], kept[3]
    assert "takes no images" in kept[2][0]


def test_a_context_llama_cpp_rounded_up_is_said_the_same(home, smollm2_path):
    # the load's notes were dropped on the way: `run -c 64` warned of the rounding, with --keep-alive nothing
    plain, kept = both(home, "run", "-m", str(smollm2_path), "-c", "64", "-n", "2", "--temperature", "0", "-p", "Hi")
    assert plain[0] == kept[0] == 0
    assert any("llama.cpp rounded 64 up to a multiple of 256" in line for line in plain[2]), plain[3]
    assert plain[2] == kept[2], kept[3]
