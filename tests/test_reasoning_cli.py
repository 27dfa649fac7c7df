"""Reasoning and template variables in run, chat and batch, on the scripted fake backend
(tests/fakebackend.py) answering as a reasoning model would: the thinking never reaches stdout."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from localinfer.cli.main import build_app
from localinfer.request.reasoning import Markers

pytestmark = pytest.mark.llama  # the commands ask llama.cpp about the build (tests/conftest.py)

THINKING = ["<think>", "\nThe user", " wants", " a greeting.", "\n</think>", "\n\n", "Hello", "!"]


@pytest.fixture
def thinker(fake_backend):  # noqa: F811
    fake_backend.reasoning = Markers("<think>", "</think>")
    return fake_backend


def _invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(build_app(), [*args], input=input)


def test_run_prints_only_the_answer_on_stdout(thinker, smollm2_path):
    thinker.enqueue(THINKING)
    res = _invoke("run", "--no-log", "-m", str(smollm2_path), "-p", "hi")
    assert res.exit_code == 0, res.output
    assert res.stdout == "Hello!\n"
    assert "think" not in res.stdout and "greeting" not in res.stderr  # not a terminal: not shown
    assert " · 8 tokens · 5 thinking (first after " in res.stderr  # the stats line counts them


def test_run_on_a_terminal_shows_the_thinking_on_stderr_unless_hidden(thinker, smollm2_path, monkeypatch):
    from localinfer.render import thinking

    monkeypatch.setattr(thinking, "is_tty", lambda _stream: True)
    thinker.enqueue(THINKING)
    res = _invoke("run", "--no-log", "-m", str(smollm2_path), "-p", "hi")
    assert res.stdout == "Hello!\n"
    assert "The user wants a greeting." in res.stderr and "<think>" not in res.stderr
    thinker.enqueue(THINKING)
    hidden = _invoke("run", "--no-log", "--hide-thinking", "-m", str(smollm2_path), "-p", "hi")
    assert hidden.stdout == "Hello!\n" and "greeting" not in hidden.stderr


def test_run_json_has_the_reasoning_apart(thinker, smollm2_path):
    thinker.enqueue(THINKING)
    res = _invoke("run", "--no-log", "--json", "-m", str(smollm2_path), "-p", "hi")
    out = json.loads(res.stdout)
    assert out["text"] == "Hello!" and out["reasoning"] == "The user wants a greeting."
    assert out["usage"]["reasoning_tokens"] == 5 and out["usage"]["completion_tokens"] == 8
    assert out["timings"]["reasoning_ttft_ms"] is not None


def test_an_answer_without_markers_has_null_reasoning(fake_backend, smollm2_path):  # noqa: F811
    fake_backend.enqueue(["<think>", "kept", "</think>"])  # not a reasoning template: text as is
    out = json.loads(_invoke("run", "--no-log", "--json", "-m", str(smollm2_path), "-p", "hi").stdout)
    assert out["text"] == "<think>kept</think>" and out["reasoning"] is None


def test_template_variables_and_think_flags_reach_the_request(fake_backend, smollm2_path):  # noqa: F811
    res = _invoke("run", "--no-log", "-q", "-m", str(smollm2_path), "-p", "hi",
                  "--chat-template-kwargs", '{"reasoning_effort": "high", "enable_thinking": true}', "--no-think")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert fake_backend.requests[-1].chat_template_kwargs == {"reasoning_effort": "high", "enable_thinking": False}
    _invoke("run", "--no-log", "-q", "-m", str(smollm2_path), "-p", "hi")
    assert fake_backend.requests[-1].chat_template_kwargs is None


@pytest.mark.parametrize(
    ("value", "needle"),
    [("{not json", "is not valid JSON"), ("[1, 2]", "must be an object"), ('{"messages": []}', "may not set 'messages'")],
)
def test_bad_template_kwargs_exit_2_naming_the_option(fake_backend, smollm2_path, value, needle):  # noqa: F811
    res = _invoke("run", "--no-log", "-m", str(smollm2_path), "-p", "hi", "--chat-template-kwargs", value)
    assert res.exit_code == 2
    assert "--chat-template-kwargs" in res.stderr and needle in res.stderr
    assert not fake_backend.requests


def test_chat_think_off_and_the_history_keeps_no_thinking(thinker, smollm2_path):
    thinker.enqueue(THINKING)
    thinker.enqueue(["Fine."])
    res = _invoke("chat", "-m", str(smollm2_path), "--offline", "--no-log", input="hi\n/think off\nagain\n")
    assert res.exit_code == 0, res.output
    assert res.stdout == "Hello!\nFine.\n"
    first, second = thinker.requests
    assert first.chat_template_kwargs is None
    assert second.chat_template_kwargs == {"enable_thinking": False}
    assert {"role": "assistant", "content": "Hello!"} in second.messages  # the answer, not its thinking
    assert not any("greeting" in str(m) for m in second.messages)
    bad = _invoke("chat", "-m", str(smollm2_path), "--offline", "--no-log", input="/think maybe\n")
    assert "/think takes on or off" in bad.stderr


def test_batch_lines_carry_the_reasoning(thinker, smollm2_path, tmp_path):
    thinker.enqueue(THINKING)
    thinker.enqueue(["No thinking here."])
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": "yo"}\n')
    res = _invoke("batch", "-m", str(smollm2_path), "--offline", "--no-log", "-q", "--parallel", "1", str(src),
                  "--chat-template-kwargs", '{"enable_thinking": true}')  # fmt: skip
    assert res.exit_code == 0, res.output
    lines = {d["id"]: d for d in map(json.loads, res.stdout.splitlines())}
    assert lines["a"]["text"] == "Hello!" and lines["a"]["reasoning"] == "The user wants a greeting."
    assert lines["a"]["usage"]["reasoning_tokens"] == 5
    assert lines["b"]["text"] == "No thinking here." and lines["b"]["reasoning"] is None
    assert all(r.chat_template_kwargs == {"enable_thinking": True} for r in thinker.requests)


def test_the_usage_history_counts_the_reasoning_tokens(thinker, smollm2_path):
    from localinfer.usage.history import load_records

    thinker.enqueue(THINKING)
    res = _invoke("run", "-q", "-m", str(smollm2_path), "-p", "hi")
    assert res.exit_code == 0, res.output
    (record,) = load_records()
    assert record.completion_tokens == 8 and record.extra["reasoning_tokens"] == 5
