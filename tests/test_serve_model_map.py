"""serve --map-model PATTERN=MODEL: names no installed model has (an agent's `claude-haiku-…`) are
answered by a served model on every wire, an installed name always wins, and the log says so."""

from __future__ import annotations

import dataclasses
import json

import pytest
from test_serve import HI, call
from test_serve_multi_logic import served

from localinfer.errors import UsageError
from localinfer.serve.models import model_map
from localinfer.serve.http.app import ServerState
from localinfer.serve.wires.openai import ApiError


def _mapped(monkeypatch, *specs: str):
    s = served(monkeypatch)
    s.config = dataclasses.replace(s.config, model_map=model_map.parse(list(specs)))
    return s, ServerState(s.config, s)


def test_an_unknown_name_matching_a_pattern_is_answered_by_its_model_on_every_wire(monkeypatch):
    s, state = _mapped(monkeypatch, "claude-*=smol", "*=gemma")
    status, _, data = call(state, "POST", "/v1/chat/completions", {"messages": HI, "model": "claude-haiku-4-5-20251001"})
    assert status == 200 and json.loads(data)["model"] == "smol"
    assert s.resolve("claude-opus-4")[0] == "smol"  # the lookup every wire (Anthropic's too) goes through
    status, _, data = call(state, "POST", "/v1/chat/completions", {"messages": HI, "model": "Claude-Sonnet-4"})
    assert status == 200 and json.loads(data)["choices"][0]["message"]["content"] == "smol"  # case-blind
    status, _, data = call(state, "POST", "/api/generate", {"prompt": "x", "model": "gpt-4o", "stream": False})
    assert status == 200 and json.loads(data)["response"] == "gemma"  # the first match wins: '*'
    assert s.resolve("smol")[0] == "smol" and s.resolve("gemma:latest")[0] == "gemma"  # installed names win


def test_without_a_match_or_with_a_target_not_served_it_is_still_a_404(monkeypatch):
    s, state = _mapped(monkeypatch, "claude-*=qwen")
    with pytest.raises(ApiError) as err:
        s.resolve("claude-haiku-4-5")
    assert err.value.status == 404
    s, state = _mapped(monkeypatch, "claude-*=smol")
    status, _, data = call(state, "POST", "/v1/chat/completions", {"messages": HI, "model": "gpt-4o"})
    assert status == 404 and "gpt-4o" in json.loads(data)["error"]["message"]


@pytest.mark.parametrize("spec", ["smol", "=smol", "claude-*=", "  =  "])
def test_a_malformed_mapping_is_a_usage_error(spec):
    with pytest.raises(UsageError, match="PATTERN=MODEL"):
        model_map.parse([spec])


def test_each_mapping_is_one_line_of_the_log():
    lines = model_map.lines(model_map.parse(["claude-*=smol", "*=gemma"]))
    assert len(lines) == 2 and "'claude-*'" in lines[0] and "smol" in lines[0] and "gemma" in lines[1]


def test_the_flag_is_checked_by_serve():
    from typer.testing import CliRunner

    from localinfer.cli.main import build_app

    result = CliRunner().invoke(build_app(), ["serve", "--map-model", "claude-*", "--port", "0"])
    assert result.exit_code == 2 and "PATTERN=MODEL" in result.output, result.output
