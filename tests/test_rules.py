"""One rule table (localinfer.rules): the same value gets the same verdict and the same message from
`run`'s options, a batch line, chat's `/set` and serve - and malformed input is a 4xx or an error
record at every entry point, never a 500, an ended job or an ended session (issue 26, issue 31)."""

from __future__ import annotations

import contextlib
import io
import json
import math
from typing import Any

import pytest
from typer.testing import CliRunner

from localinfer import rules
from localinfer.batch.io import BatchRequest, InputError, JsonlSink, parse_input
from localinfer.chat.conversation import Conversation
from localinfer.chat.settings import ChatSettings
from localinfer.errors import UsageError

pytest.importorskip("starlette")

from starlette.testclient import TestClient  # noqa: E402

from localinfer.serve.app import ServerState, create_app  # noqa: E402
from localinfer.serve.config import ServeConfig  # noqa: E402
from localinfer.serve.protocol import ApiError, CompletionRequest, parse_request  # noqa: E402

FLAGS = {"temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k", "min_p": "--min-p",
         "repeat_penalty": "--repeat-penalty", "seed": "--seed", "max_tokens": "--max-tokens"}  # fmt: skip
EDGES = [0, 1, 2, 3, -1, 0.5, 1.5, 3.0, -0.0, 1e-9, math.nan, math.inf, -math.inf, True, False,
         2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1, 2**64, 10**30]  # fmt: skip
HI = [{"role": "user", "content": "hi"}]


class StubEngine:
    """Stands where the model would: a request that reaches it was accepted by the protocol."""

    n_ctx_seq, parallel, running, queued, cells_used, cells_total = 512, 1, 0, 0, 0, 512

    def __init__(self) -> None:
        self.seen: list[CompletionRequest] = []

    def arriving(self) -> Any:
        return contextlib.nullcontext()

    def prepare(self, request: CompletionRequest) -> Any:
        self.seen.append(request)
        raise ApiError(418, "reached the engine", code="accepted")


def serve_client(engine: StubEngine | None = None) -> TestClient:
    state = ServerState(ServeConfig(), ("m", "m.gguf"), engine=engine or StubEngine())  # type: ignore[arg-type]
    return TestClient(create_app(state), base_url="http://127.0.0.1:8080", raise_server_exceptions=False)


def post(client: TestClient, body: bytes | dict[str, Any], path: str = "/v1/chat/completions") -> tuple[int, dict[str, Any]]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = client.post(path, content=raw, headers={"content-type": "application/json"})
    return r.status_code, r.json()


def typed(value: Any) -> str:
    """How a user types the JSON value ``value`` after a flag or `/set KEY`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return json.dumps(value)


def _verdicts(field: str, value: Any, client: TestClient) -> dict[str, str | None]:
    """Each entry point's verdict: None (accepted) or its error message."""
    out: dict[str, str | None] = {}
    cli = CliRunner().invoke(_app(), ["run", FLAGS[field], typed(value), "--endpoint", "http://127.0.0.1:9/v1",
                                      "--timeout", "1", "-p", "hi", "--no-log"])  # fmt: skip
    refused = cli.exit_code == 2 and "Invalid value" in cli.output
    assert refused or cli.exit_code == 5, cli.output  # accepted: it got as far as connecting (refused: 5)
    out["run"] = " ".join(cli.output.split()) if refused else None
    item = parse_input(json.dumps({"id": "x", "prompt": "hi", field: value}).encode(), "jsonl")[0]
    out["batch"] = item.reason if isinstance(item, InputError) else None
    try:
        ChatSettings().with_value(field, typed(value))
        out["/set"] = None
    except UsageError as exc:
        out["/set"] = str(exc)
    status, body = post(client, {"messages": HI, field: value})
    assert status in (400, 418), body
    out["serve"] = body["error"]["message"] if status == 400 else None
    return out


_APP: list[Any] = []


def _app() -> Any:
    if not _APP:
        from localinfer.cli.main import build_app

        _APP.append(build_app(only="run"))
    return _APP[0]


@pytest.mark.parametrize("field", FLAGS)
def test_an_edge_value_gets_one_verdict_and_one_message_everywhere(field):
    client = serve_client()
    for value in EDGES:
        v = _verdicts(field, value, client)
        try:
            rules.check(field, value)
            expected = None
        except rules.RuleError as exc:
            expected = exc
        if expected is None:
            assert v == dict.fromkeys(v), (field, value, v)
            continue
        assert v["batch"] == v["/set"] == v["serve"] == str(expected), (field, value, v)
        assert v["run"] is not None and expected.problem in v["run"], (field, value, v)  # Typer names the flag


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temperature", 3, "'temperature' must be a number between 0 and 2, not 3"),
        ("temperature", math.nan, "'temperature' must be a number between 0 and 2, not NaN"),  # not "a number"
        ("top_p", math.inf, "'top_p' must be a number between 0 and 1, not infinity"),
        ("seed", -1, "'seed' must be an integer between 0 and 4294967294, not -1"),
        ("seed", 2**32 - 1, "'seed' must be an integer between 0 and 4294967294, not 4294967295"),
        ("max_tokens", 0, "'max_tokens' must be an integer >= 1, not 0"),
        ("max_tokens", True, "'max_tokens' must be an integer >= 1, not true"),
        ("top_k", 10**30, "'top_k' must be an integer between 0 and 2147483647, not a 31-digit integer"),
        ("repeat_penalty", 10**400, "'repeat_penalty' must be a number >= 0, not a 401-digit integer"),
    ],
)
def test_the_messages_say_the_bounds_and_the_value(field, value, message):
    with pytest.raises(rules.RuleError) as info:
        rules.check(field, value)
    assert str(info.value) == message


def test_typed_text_means_what_json_means():
    assert rules.parse_text("seed", "random") is None and rules.parse_text("max_tokens", "unlimited") is None
    assert rules.parse_text("temperature", " 0.7 ") == 0.7 and rules.parse_text("top_k", "+5") == 5
    for text in ("1_0", "0x10", "five", ""):
        with pytest.raises(rules.RuleError, match="must be"):
            rules.parse_text("top_k", text)
    with pytest.raises(rules.RuleError, match="a 5000-digit integer"):
        rules.parse_text("max_tokens", "9" * 5000)  # more digits than Python converts


def test_cli_help_shows_the_bounds():
    out = CliRunner().invoke(_app(), ["run", "--help"], env={"COLUMNS": "160"}).output
    assert "FLOAT 0..2" in out and "INTEGER 0..4294967294" in out and "INTEGER >=1" in out


# -- messages: one set of roles and content shapes ---------------------------------------------------------
MESSAGE_CASES = [
    ([{"role": "developer", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "a"}]}], None),
    ([{"role": "assistant", "content": None}, {"role": "user", "content": "x", "name": "ann", "tool_calls": None}], None),
    ([{"role": "tool", "content": "x"}], "'messages[0].role' must be one of system, developer, user, assistant, not 'tool'"),
    ([{"role": "user"}], "'messages[0]' must be an object with 'role' and 'content'"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "'messages[0].content[0]' must be a text part"),
    ([{"role": "user", "content": "x", "tool_calls": []}], "'messages[0]' has 'tool_calls', which is not supported"),
    ([{"role": "user", "content": "\ud800"}], "'messages[0].content' holds a lone surrogate (\\ud800), which is not text"),
]


@pytest.mark.parametrize(("messages", "problem"), MESSAGE_CASES)
def test_messages_get_one_verdict_from_batch_serve_and_load(messages, problem, tmp_path):
    item = parse_input(json.dumps({"id": 1, "messages": messages}).encode(), "jsonl")[0]
    status, body = post(serve_client(), {"messages": messages})
    path = tmp_path / "chat.json"
    path.write_text(json.dumps({"messages": messages}))
    try:
        Conversation.__new__(Conversation).load(path)  # the parse alone: no model is needed for it
        loaded = None
    except UsageError as exc:
        loaded = str(exc)
    if problem is None:
        assert isinstance(item, BatchRequest) and status == 418 and loaded is None, (item, body, loaded)
        return
    assert isinstance(item, InputError) and problem in item.reason
    assert status == 400 and problem in body["error"]["message"]
    assert loaded is not None and problem in loaded




def test_a_batch_lines_sampling_fields_reach_a_remote_server_too():
    from localinfer.engine.types import SamplingOptions
    from localinfer.remote.client import request_body

    item = parse_input(b'{"prompt": "x", "presence_penalty": 0.5, "repeat_last_n": 32, "top_k": 7}', "jsonl")[0]
    assert isinstance(item, BatchRequest)
    body = request_body("m", prompt="x", sampling=item.sampling_over(SamplingOptions()))
    assert (body["presence_penalty"], body["repeat_last_n"], body["top_k"]) == (0.5, 32, 7)
    plain = request_body("m", prompt="x", sampling=SamplingOptions())
    assert not {"presence_penalty", "frequency_penalty", "repeat_last_n", "top_k"} & set(plain)
