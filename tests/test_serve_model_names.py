"""A request's model name is bounded before it is looked up or echoed: a megabyte of name is a 400
in the wire's own shape, at once, whose message does not quote it (difflib against every installed
name took seconds of the server's CPU, and the 404 sent it all back)."""

from __future__ import annotations

import json
import time

import pytest
from test_serve import HI, call
from test_serve_multi_logic import served

from localinfer.request.rules import MAX_MODEL_NAME
from localinfer.serve.http.app import ServerState
from localinfer.serve.config import ServeConfig
from localinfer.serve.wires.openai import ApiError

LONG = "smol" + "x" * 1_000_000


def _message(path: str, data: bytes) -> str:
    body = json.loads(data)
    if path.startswith("/api/"):
        return body["error"]  # Ollama's
    if path.startswith("/v1/messages"):
        assert body["type"] == "error"  # Anthropic's
    return body["error"]["message"]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": HI}), ("/v1/completions", {"prompt": "x"}),
    ("/v1/embeddings", {"input": "x"}), ("/v1/messages", {"messages": HI, "max_tokens": 4}),
    ("/v1/messages/count_tokens", {"messages": HI}), ("/v1/responses", {"input": "x"}),
    ("/api/chat", {"messages": HI}), ("/api/generate", {"prompt": "x"}), ("/api/embed", {"input": "x"}),
    ("/api/embeddings", {"prompt": "x"}), ("/api/show", {}), ("/api/show", {"name": LONG}),
])  # fmt: skip
def test_a_megabyte_model_name_is_a_400_that_does_not_quote_it(monkeypatch, path, body):
    s = served(monkeypatch)
    monkeypatch.setattr(s, "servable", lambda: [f"model{i}" for i in range(20)])
    state = ServerState(ServeConfig(max_body=8 << 20), s)
    body = {"model": LONG, **body} if "name" not in body else body
    t0 = time.perf_counter()
    status, _, data = call(state, "POST", path, body)
    assert status == 400 and time.perf_counter() - t0 < 1.5
    message = _message(path, data)
    assert f"at most {MAX_MODEL_NAME}" in message and "xxxxxxxxxx" not in message and len(data) < 1000
    assert not s.router.slots


def test_the_lookup_itself_bounds_the_name(monkeypatch):
    s = served(monkeypatch)
    with pytest.raises(ApiError) as err:
        s.resolve(LONG)
    assert err.value.status == 400 and "xxxxxxxxxx" not in err.value.message
    with pytest.raises(ApiError) as err:
        s.resolve("smol" + "x" * (MAX_MODEL_NAME - 4))  # as long as a name may be: looked up
    assert err.value.status == 404 and "closest installed: smol" in err.value.message
