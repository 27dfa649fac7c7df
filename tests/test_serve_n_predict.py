"""`serve -n N` (llama-server's --n-predict) on a real SmolLM2: the cap of an answer whose request
names none, on every wire; a request's own limit wins. The Responses API calls an answer the server
cut ``completed`` (Codex fails its turn on an ``incomplete`` one) and keeps ``incomplete``
for the request's own ``max_output_tokens``; a call the cap cut short comes back in the next turn's
input and is taken (its arguments ``{}``), not refused."""

from __future__ import annotations

import json
import urllib.request

import pytest
from test_serve_model import ServeProcess

pytestmark = pytest.mark.slow
CAP = 5
LONG = "Write a long story about a dragon."


@pytest.fixture(scope="module")
def served(smollm2_path, tmp_path_factory):
    with ServeProcess(smollm2_path, "-np", "1", "-c", "1024", "-t", "1", "-n", str(CAP), home=tmp_path_factory.mktemp("serve-home")) as s:
        yield s


def _post(s: ServeProcess, path: str, body: dict) -> bytes:
    request = urllib.request.Request(s.base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:  # noqa: S310 - the test's own server
        return response.read()


def test_chat_without_a_limit_stops_at_the_servers_cap_and_a_requests_own_limit_wins(served):
    chat = {"messages": [{"role": "user", "content": LONG}], "temperature": 0, "ignore_eos": True}
    capped = json.loads(_post(served, "/v1/chat/completions", chat))
    assert capped["usage"]["completion_tokens"] == CAP and capped["choices"][0]["finish_reason"] == "length"
    own = json.loads(_post(served, "/v1/chat/completions", {**chat, "max_tokens": CAP + 3}))
    assert own["usage"]["completion_tokens"] == CAP + 3


def test_responses_cut_by_the_server_is_completed_and_cut_by_the_request_incomplete(served):
    body = {"input": LONG, "temperature": 0, "stream": True}
    events = [json.loads(line[6:]) for line in _post(served, "/v1/responses", body).splitlines() if line.startswith(b"data: ")]
    last = events[-1]
    assert last["type"] == "response.completed" and last["response"]["status"] == "completed", last
    assert last["response"]["usage"]["output_tokens"] <= CAP and last["response"]["incomplete_details"] is None
    own = json.loads(_post(served, "/v1/responses", {"input": LONG, "max_output_tokens": 2, "temperature": 0}))
    assert own["status"] == "incomplete" and own["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_past_call_the_cap_cut_short_is_taken_back_with_empty_arguments():
    # the server sends a call cut by its cap as written ('{"'); Codex runs it, gets a parse error as the
    # tool's output, and sends it all back: that turn was a 400 ("must be a JSON object"), exit 1
    from localinfer.serve.wires import responses as responses_api
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
             {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"'},
             {"type": "function_call_output", "call_id": "c1", "output": "failed to parse function arguments"}]  # fmt: skip
    r = responses_api.parse({"input": items}).request
    assert r.messages[1]["tool_calls"][0]["function"] == {"name": "exec_command", "arguments": {}}
    whole = responses_api.parse({"input": [items[0], {**items[1], "arguments": '{"cmd": "ls"}'}, items[2]]}).request
    assert whole.messages[1]["tool_calls"][0]["function"]["arguments"] == {"cmd": "ls"}
