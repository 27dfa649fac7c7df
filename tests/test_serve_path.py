"""One serve path: a body is parsed and checked before any model is picked, so a malformed request
never loads (or reloads) a model, on every wire."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_serve import HI, call
from test_serve_multi_logic import Engine, served

from localinfer.serve.http.app import ServerState
from localinfer.serve.config import ServeConfig
from localinfer.serve.models.multi import LoadedEngine

BAD = [
    ("/api/chat", {"model": "gemma", "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ("/api/chat", {"model": "gemma", "messages": HI, "options": {"temperature": 7}}, "options.temperature"),
    ("/api/chat", {"model": "gemma", "messages": HI, "keep_alive": "soon"}, "keep_alive"),
    ("/api/generate", {"model": "gemma", "prompt": "x", "suffix": "y"}, "suffix"),
    ("/api/generate", {"model": "gemma", "prompt": "x", "options": {"num_predict": 0}}, "options.num_predict"),
    ("/api/generate", {"model": "gemma", "prompt": 3}, "prompt"),
]


@pytest.mark.parametrize(("path", "body", "field"), BAD)
def test_a_malformed_ollama_body_is_a_400_and_loads_nothing(monkeypatch, path, body, field):
    made: list[str] = []

    def make(resolved: Any, name: str, want: Any) -> Any:
        made.append(name)
        return LoadedEngine(name, Engine(pieces=(name,)))

    s = served(monkeypatch, make)
    state = ServerState(ServeConfig(), s)
    status, _, data = call(state, "POST", path, body)
    assert status == 400 and field in json.loads(data)["error"], data
    assert made == [] and not s.router.slots  # nothing was loaded for it
    status, _, data = call(state, "GET", "/api/ps")
    assert status == 200 and json.loads(data)["models"] == []


def test_one_pinned_model_answers_any_name_but_another_model_s_on_every_wire(monkeypatch):
    """`serve -m`: the model is pinned in the same core; a name that is not another model's reaches
    it (clients hard-code names), another installed model's is a 404, whatever the protocol."""
    from types import SimpleNamespace

    state = ServerState.holding(ServeConfig(), ("m", "m.gguf"), Engine(), key="sha256:aa")
    served = state.models
    monkeypatch.setattr(served.installed, "names", lambda: ["m-copy", "smol"])
    files = {"m-copy": SimpleNamespace(sha256="aa", path="/x/m-copy.gguf"), "smol": SimpleNamespace(sha256="bb", path="/x/smol.gguf")}
    monkeypatch.setattr(served, "_installed", lambda name: files[name])
    for name in ("m", "m:latest", "gpt-4o", "m-copy", None):  # m-copy: another name of our file
        body = {"messages": HI, **({"model": name} if name else {})}
        status, _, data = call(state, "POST", "/v1/chat/completions", body)
        assert status == 200 and json.loads(data)["model"] == "m", (name, data)
    status, _, data = call(state, "POST", "/api/generate", {"prompt": "x", "model": "gpt-4o", "stream": False})
    assert status == 200 and json.loads(data)["model"] == "gpt-4o"  # Ollama echoes the name asked for
    for path, body in (("/v1/chat/completions", {"messages": HI, "model": "smol"}),
                       ("/api/chat", {"messages": HI, "model": "smol:latest"}),
                       ("/v1/completions", {"prompt": "x", "model": "other.gguf"})):  # fmt: skip
        status, _, data = call(state, "POST", path, body)
        assert status == 404, (path, data)


def test_a_malformed_body_is_a_400_even_while_the_pinned_model_loads():
    state = ServerState.holding(ServeConfig(), ("m",), None)
    status, _, data = call(state, "POST", "/api/chat", {"model": "m", "messages": HI, "options": {"temperature": 7}})
    assert status == 400 and "options.temperature" in json.loads(data)["error"]
    status, headers, data = call(state, "POST", "/api/chat", {"model": "m", "messages": HI})
    assert status == 503 and headers["retry-after"] == "1"  # a well-formed one waits for the load


def test_no_route_asks_which_models_are_served():
    """The routes reach the models through ``Served.pick`` and the listings only."""
    from pathlib import Path

    import localinfer.serve as serve

    folder = Path(serve.__file__).parent
    for module in ("http/app", "http/exchange", "wires/catalog", "wires/ollama/routes", "wires/llama"):
        text = (folder / f"{module}.py").read_text()
        for asked in (".router", ".pin", "engine is None", ".names"):
            assert asked not in text, (module, asked)
