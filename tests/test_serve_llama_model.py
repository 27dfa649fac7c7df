"""llama-server's endpoints on a real `localinfer serve` (SmolLM2): /tokenize and /detokenize agree
with the model's own tokenizer, and /apply-template, /props and the input_tokens counts agree with
what a chat or Responses request evaluates (its usage), and with /v1/models."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_serve_model import ServeProcess

pytestmark = pytest.mark.slow

TEXT = "Héllo, wörld! <|im_start|> 🦙 tokens"
CHAT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour. 🦙"}],
        "max_tokens": 1, "temperature": 0}  # fmt: skip


@pytest.fixture(scope="module")
def served(smollm2_path, tmp_path_factory):
    with ServeProcess(smollm2_path, "-np", "2", "-c", "1024", "-t", "1", home=tmp_path_factory.mktemp("llama-routes")) as s:
        yield s


def _post(s: ServeProcess, path: str, body: Any) -> Any:
    status, _, data = s.request("POST", path, body)
    assert status == 200, data
    return json.loads(data)


def test_tokenize_and_detokenize_are_the_models_own(served, smollm2_path):
    from localinfer.engine.model import LlamaModel
    from localinfer.engine.types import LoadOptions

    with LlamaModel(smollm2_path, LoadOptions(n_ctx=256, n_threads=1)) as model:
        for add, special in ((False, True), (True, False)):
            ids = _post(served, "/tokenize", {"content": TEXT, "add_special": add, "parse_special": special})["tokens"]
            assert ids == model.tokenize(TEXT, add_special=add, parse_special=special)
        assert _post(served, "/detokenize", {"tokens": ids})["content"] == TEXT
        pieces = _post(served, "/tokenize", {"content": TEXT, "with_pieces": True})["tokens"]
        assert [p["id"] for p in pieces] == model.tokenize(TEXT, add_special=False, parse_special=True)
        joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
        assert joined.decode() == TEXT  # the llama's bytes come split across pieces, as lists of bytes
        assert any(isinstance(p["piece"], list) for p in pieces)


def test_apply_template_and_input_tokens_count_what_the_chat_request_evaluates(served):
    usage = _post(served, "/v1/chat/completions", CHAT)["usage"]["prompt_tokens"]
    prompt = _post(served, "/apply-template", CHAT)["prompt"]
    assert prompt.startswith("<|im_start|>system\nBe brief.") and prompt.endswith("<|im_start|>assistant\n")
    assert len(_post(served, "/tokenize", {"content": prompt})["tokens"]) == usage
    assert _post(served, "/v1/chat/completions/input_tokens", CHAT) == {"object": "chat.completion.input_tokens", "input_tokens": usage}
    body = {"input": "Name a colour.", "instructions": "Be brief.", "max_output_tokens": 16, "temperature": 0}
    responses_usage = _post(served, "/v1/responses", body)["usage"]["input_tokens"]
    assert _post(served, "/v1/responses/input_tokens", body) == {"object": "response.input_tokens", "input_tokens": responses_usage}


def test_props_n_ctx_is_the_models_context_per_sequence(served):
    props = json.loads(served.request("GET", "/props")[2])
    meta = json.loads(served.request("GET", "/v1/models")[2])["data"][0]["meta"]
    assert props["default_generation_settings"]["n_ctx"] == meta["n_ctx_seq"] > 0
    assert props["total_slots"] == 2 and props["modalities"]["vision"] is False
    assert props["model_path"] == props["model_alias"] and "/" not in props["model_path"]
    assert "<|im_start|>" in props["chat_template"] and props["chat_template_caps"]["supports_system_role"] is True


LLAMA_SERVER = Path(__file__).resolve().parents[1] / "benchmarks" / ".build" / "bin" / "llama-server"


@pytest.mark.skipif(not LLAMA_SERVER.exists() or shutil.which("curl") is None, reason="llama-server is not built (benchmarks/.build)")
def test_the_shapes_are_llama_servers(served, smollm2_path):
    import http.client
    import socket
    import subprocess
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([str(LLAMA_SERVER), "-m", str(smollm2_path), "--port", str(port), "-c", "1024", "-np", "2", "-t", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip

    def ask(method: str, path: str, body: Any = None) -> Any:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request(method, path, None if body is None else json.dumps(body), {"Content-Type": "application/json"})
        return json.loads(conn.getresponse().read())

    try:
        for _ in range(600):
            try:
                if ask("GET", "/health").get("status") == "ok":
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        for path, body in (("/tokenize", {"content": TEXT, "with_pieces": True}), ("/detokenize", {"tokens": [1, 2, 3]}),
                           ("/apply-template", CHAT)):  # fmt: skip
            theirs, ours = ask("POST", path, body), _post(served, path, body)
            assert theirs == ours if path != "/apply-template" else set(theirs) == set(ours)
        theirs, ours = ask("GET", "/props"), json.loads(served.request("GET", "/props")[2])
        assert set(ours) <= set(theirs) | {"chat_template_caps"} and theirs["total_slots"] == ours["total_slots"]
    finally:
        proc.terminate()
        proc.wait(30)
