"""`run`'s CLI logic on the scripted fake engine (tests/fakeengine.py): milliseconds, no model."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from localinfer.cli.main import build_app

pytestmark = pytest.mark.llama  # the commands ask llama.cpp about the build (tests/conftest.py)


def _run(*args: str):
    return CliRunner().invoke(build_app(), ["run", "--no-log", *args])


def test_the_answer_goes_to_stdout_and_one_stats_line_to_stderr(fake_engine, smollm2_path):  # noqa: F811
    fake_engine.enqueue(["Hello", ",", " world"])
    res = _run("-m", str(smollm2_path), "-p", "hi there")
    assert res.exit_code == 0, res.output
    assert res.stdout == "Hello, world\n"
    line = res.stderr.strip()
    assert "3 tokens" in line and "finish stop" in line and "\n" not in line
    assert fake_engine.texts[0] == "<user>hi there <assistant>"  # through the model's chat template
    assert fake_engine.loads[0].n_ctx == 4096  # the trained context (8192), capped at 4096


def test_json_carries_usage_timings_and_finish(fake_engine, smollm2_path):  # noqa: F811
    fake_engine.enqueue(["a", "b", "c", "d"])
    res = _run("-m", str(smollm2_path), "-p", "x", "--json", "-n", "2")
    data = json.loads(res.stdout)
    assert data["text"] == "ab" and data["finish_reason"] == "length" and "finish length" in res.stderr
    assert data["usage"]["completion_tokens"] == 2 and data["timings"]["ttft_ms"] is not None


def test_quiet_prints_only_the_answer(fake_engine, smollm2_path):  # noqa: F811
    fake_engine.enqueue(["just", " this"])
    res = _run("-m", str(smollm2_path), "-p", "x", "-q")
    assert (res.stdout, res.stderr) == ("just this\n", "")


def test_a_stop_string_is_passed_to_the_engine_with_the_templates(fake_engine, smollm2_path, monkeypatch):  # noqa: F811
    seen = {}
    from fakeengine import FakeModel

    real = FakeModel.generate

    def spy(self, prompt, sampling, stats, **kw):
        seen.update(kw)
        return real(self, prompt, sampling, stats, **kw)

    monkeypatch.setattr(FakeModel, "generate", spy)
    _run("-m", str(smollm2_path), "-p", "x", "--stop", "END", "--seed", "3", "--temperature", "0")
    assert "END" in seen["stop"] and "</s>" in seen["stop"]


def test_an_overflowing_prompt_exits_6_before_generating(fake_engine, smollm2_path):  # noqa: F811
    res = _run("-m", str(smollm2_path), "-c", "256", "-n", "8", "-p", "word " * 300)
    assert res.exit_code == 6 and "exceed the context window (256 tokens)" in res.stderr
    assert fake_engine.prompts == [] and res.stdout == ""


def test_a_prompt_that_is_not_utf8_is_a_usage_error(fake_engine, smollm2_path):  # noqa: F811
    # `run -p $'hi \xff'` was "internal error: UnicodeEncodeError" (issue 22): argv's byte 0xff
    # reaches Python as the surrogate U+DCFF.
    res = _run("-m", str(smollm2_path), "-p", "hi \udcff")
    assert res.exit_code == 2 and "the prompt is not valid UTF-8 (byte 0xff at character 4)" in res.stderr
    assert fake_engine.prompts == []
