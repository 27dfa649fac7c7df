"""One rule table (localinfer.request.rules): the same value gets the same verdict and the same message from
`run`'s options, a batch line, chat's `/set` and serve - and malformed input is a 4xx or an error
record at every entry point, never a 500, an ended job or an ended session (issue 26, issue 31)."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import pytest
from typer.testing import CliRunner

from localinfer.request import rules
from localinfer.batch.io import BatchRequest, InputError, JsonlSink, parse_input
from localinfer.chat.conversation import Conversation
from localinfer.chat.settings import ChatSettings
from localinfer.errors import UsageError

pytest.importorskip("starlette")

from starlette.testclient import TestClient

from localinfer.serve.http.app import ServerState, create_app
from localinfer.serve.config import ServeConfig
from localinfer.serve.wires.openai import ApiError, Envelope, parse_request

FLAGS = {"temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k", "min_p": "--min-p",
         "repeat_penalty": "--repeat-penalty", "seed": "--seed", "max_tokens": "--max-tokens"}  # fmt: skip
EDGES = [0, 1, 2, 3, -1, 0.5, 1.5, 3.0, -0.0, 1e-9, math.nan, math.inf, -math.inf, True, False,
         2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1, 2**64, 10**30]  # fmt: skip
HI = [{"role": "user", "content": "hi"}]


class StubEngine:
    """Stands where the model would: a request that reaches it was accepted by the protocol."""

    n_ctx_seq, parallel, running, queued, cells_used, cells_total = 512, 1, 0, 0, 0, 512
    prompt_cache = None  # the figures of a host prompt cache: none here

    def __init__(self) -> None:
        self.seen: list[Envelope] = []

    def prepare(self, request: Envelope, clamp: bool = False) -> Any:
        self.seen.append(request)
        raise ApiError(418, "reached the engine", code="accepted")


def serve_client(engine: StubEngine | None = None) -> TestClient:
    state = ServerState.holding(ServeConfig(), ("m", "m.gguf"), engine or StubEngine())  # type: ignore[arg-type]
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
    ([{"role": "tool", "content": "x"}], "'messages[0].tool_call_id' must be a string, not null"),
    ([{"role": "tool", "content": "x", "tool_call_id": "call_1"}], "'messages[0].tool_call_id' is 'call_1', which no earlier assistant"),
    ([{"role": "robot", "content": "x"}], "'messages[0].role' must be one of system, developer, user, assistant, tool, not 'robot'"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{"}}]}],
     None),  # a call a cap cut short, sent back: its arguments are {} (test_a_past_call_cut_short_...)
    ([{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": [1]}}]}],
     "'messages[0].tool_calls[0].function.arguments' must be a JSON object, not"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "content": "42", "tool_call_id": "c1"}], None),
    ([{"role": "user"}], "'messages[0]' must be an object with 'role' and 'content'"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content[0].image_url must be a data: URI"),
    ([{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "x"}}]}], "'messages[0].content[0]' must be a text part"),
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


def test_a_past_call_cut_short_is_taken_with_empty_arguments_on_every_wire():
    # a call our cap cut short is sent as written ('{"command": "l'); agents run it, get a parse error
    # as its result and send the turn back: Chat Completions (OpenCode, Qwen Code) and Ollama refused
    # it (400, the agent's turn failed), Responses alone took it as {}
    from localinfer.serve.wires import anthropic, responses
    from localinfer.serve.wires.ollama.chat import parse_chat

    def turns(args: Any) -> list[dict[str, Any]]:
        call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": args}}
        return [*HI, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c1", "content": "bad"}]

    def items(args: str) -> list[dict[str, Any]]:
        return [{"type": "message", "role": "user", "content": "hi"}, {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": args},
                {"type": "function_call_output", "call_id": "c1", "output": "bad"}]  # fmt: skip

    def claude(args: str) -> list[dict[str, Any]]:  # the input our writer sent for the call ({"_partial": ...} when cut)
        return [*HI, {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "bash", "input": anthropic._input(args)}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "bad"}]}]  # fmt: skip

    wires = {"chat": lambda a: parse_request({"messages": turns(a)}, "chat"), "responses": lambda a: responses.parse({"input": items(a)}),
             "ollama": lambda a: parse_chat({"messages": [*turns(a)[:2], {"role": "tool", "content": "bad"}]}, "m"),
             "anthropic": lambda a: anthropic.parse({"max_tokens": 9, "messages": claude(a)})}  # fmt: skip
    for wire, parse in wires.items():
        for args, taken in (('{"command": "l', {}), ('{"', {}), ("", {}), ('{"command": "ls"}', {"command": "ls"})):
            req = parse(args).request
            called = getattr(req, "request", req).messages[1]["tool_calls"][0]["function"]  # Ollama's: an envelope
            assert called == {"name": "bash", "arguments": taken}, (wire, args, called)


# -- serve: what real clients send ----------------------------------------------------------------------
def test_fields_that_change_nothing_we_promise_are_accepted():
    body = {"messages": HI, "store": False, "metadata": {"k": "v"}, "user": "u", "service_tier": "auto",
            "parallel_tool_calls": True, "prompt_cache_key": "c", "safety_identifier": "s", "modalities": ["text"],
            "stream": True, "stream_options": {"include_usage": True, "include_obfuscation": False}}  # fmt: skip
    r = parse_request(body, "chat")
    assert r.stream and r.include_usage and r.cache_prompt
    assert parse_request({"prompt": "x", "cache_prompt": False, "n_predict": 5}, "text").request.max_tokens == 5
    r = parse_request({"prompt": "x", "cache_prompt": False, "n_predict": -1}, "text")
    assert r.request.max_tokens is None and not r.cache_prompt
    for bad, param in [({"metadata": {"k": 1}}, "metadata.k"), ({"store": "yes"}, "store"),
                       ({"n_predict": 0}, "n_predict"), ({"n_predict": 5, "max_tokens": 6}, "max_tokens"),
                       ({"cache_prompt": 1}, "cache_prompt"), ({"modalities": ["audio"]}, "modalities")]:  # fmt: skip
        with pytest.raises(ApiError) as info:
            parse_request({"messages": HI, **bad}, "chat")
        assert info.value.status == 400 and info.value.param == param


def test_a_one_model_server_answers_any_name_but_another_gguf_file():
    engine = StubEngine()
    client = serve_client(engine)
    for name in ("gpt-4o", "m", "local-model", "meta-llama/Llama-3.1-8B-Instruct"):
        assert post(client, {"messages": HI, "model": name})[0] == 418, name
    status, body = post(client, {"messages": HI, "model": "/tmp/other.gguf"})
    assert status == 404 and body["error"]["code"] == "model_not_found"


# -- malformed input: never a 500, an ended job or an ended session ------------------------------------------
@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
        b'{"messages": [{"role": "user", "content": "hi"}], "model": "\\udfff"}',
        b'{"messages": [{"role": "user", "content": "hi"}], "\\ud800": 1}',
        b'{"messages": [{"role": "user", "content": "hi"}], "seed": ' + b"9" * 5000 + b"}",
        b'{"prompt": "\\ud800"}',
        b'{"prompt": "a", "stop": ["\\udc00"]}',
    ],
)
def test_malformed_bodies_are_400(raw):
    for path in ("/v1/chat/completions", "/v1/completions"):
        status, body = post(serve_client(), raw, path)
        assert status == 400 and body["error"]["message"], body


def test_an_emoji_escaped_as_a_surrogate_pair_is_text():
    engine = StubEngine()
    assert post(serve_client(engine), b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}')[0] == 418
    assert engine.seen[0].request.messages[0]["content"] == "\U0001f600"


def test_malformed_batch_lines_are_error_records_that_can_be_written():
    lines = [
        b'{"id": "a", "prompt": "\\ud800"}',
        b'{"id": "\\ud800", "prompt": "x"}',
        b'{"id": "b", "prompt": "x", "seed": ' + b"1" * 5000 + b"}",
        b'{"id": "c", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\udbff"}]}]}',
        b'{"id": "d", "prompt": "x", "top_p": 0.5, "top_k": 3, "frequency_penalty": 1}',
    ]
    items = parse_input(b"\n".join(lines), "jsonl")
    assert [type(i).__name__ for i in items] == ["InputError"] * 4 + ["BatchRequest"]
    assert "'prompt' holds a lone surrogate" in items[0].reason and items[0].id == "a"
    assert "'id' holds a lone surrogate" in items[1].reason and items[1].id is None
    assert "longer than" in items[2].reason and "digits" in items[2].reason
    sink = JsonlSink(io.BytesIO())
    for i in items[:4]:
        sink({"id": i.id, "error": i.reason, "line": i.line})  # a surrogate here would end the job
    from localinfer.request.sampling import SamplingOptions

    s = items[4].sampling_over(SamplingOptions(temperature=0.0))
    assert (s.temperature, s.top_p, s.top_k, s.frequency_penalty) == (0.0, 0.5, 3, 1.0)


def test_a_conversation_file_with_a_lone_surrogate_is_refused(tmp_path):
    path = tmp_path / "c.json"
    path.write_bytes(b'[{"role": "user", "content": "hi \\ud800"}]')
    with pytest.raises(UsageError, match="lone surrogate"):
        Conversation.__new__(Conversation).load(path)


# -- fuzzing the three entry points (bounded, seeded, no model) ------------------------------------------
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=8)  # surrogates included
_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=10**18, max_value=10**40),
                  st.floats(allow_nan=True, allow_infinity=True), _TEXT)  # fmt: skip
_JSON = st.recursive(_LEAF, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(_TEXT, kids, max_size=4), max_leaves=12)
_NAMES = st.sampled_from(["messages", "prompt", "model", "temperature", "top_p", "top_k", "seed", "max_tokens",
                          "n_predict", "stop", "stream", "stream_options", "metadata", "cache_prompt", "id", "role",
                          "content", "store", "n", "tools", "response_format"])  # fmt: skip
_MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool"]) | _TEXT},
                                 optional={"content": _JSON | _TEXT, "name": _JSON})  # fmt: skip
_REQUEST = st.fixed_dictionaries({"messages": st.lists(_MESSAGE, max_size=3)},
                                 optional={"prompt": _TEXT | _JSON, "id": _JSON}).flatmap(
    lambda base: st.dictionaries(_NAMES, _JSON, max_size=4).map(lambda extra: {**base, **extra}))  # fmt: skip
_BODY = st.one_of(_REQUEST.map(lambda b: json.dumps(b).encode()), _JSON.map(lambda b: json.dumps(b).encode()),
                  st.binary(max_size=64))  # fmt: skip
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@FUZZ
@given(_BODY)
def test_fuzzed_serve_bodies_are_never_a_500(raw):
    for path in ("/v1/chat/completions", "/v1/completions"):
        status, body = post(_FUZZ_CLIENT, raw, path)
        assert status in (400, 404, 418), (status, body)
        json.dumps(body, ensure_ascii=False).encode("utf-8")


_FUZZ_CLIENT = serve_client()


@FUZZ
@given(st.lists(_BODY, min_size=1, max_size=4))
def test_fuzzed_batch_lines_are_requests_or_writable_error_records(lines):
    items = parse_input(b"\n".join(line.replace(b"\n", b" ") for line in lines), "jsonl")
    sink = JsonlSink(io.BytesIO())
    for item in items:
        if isinstance(item, InputError):
            sink({"id": item.id, "error": item.reason})
        else:
            sink({"id": item.id, "prompt": item.prompt, "messages": item.messages, "stop": item.stop})


@FUZZ
@given(_BODY | _REQUEST.map(lambda b: json.dumps(b["messages"]).encode()))
def test_fuzzed_conversation_files_load_or_are_refused_in_one_line(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("load") / "c.json"
    path.write_bytes(raw)
    conv = Conversation.__new__(Conversation)
    try:
        conv.load(path)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    for m in conv.history:
        m["content"].encode("utf-8")  # what the session prints and tokenizes
    (conv.system or "").encode("utf-8")


def test_a_batch_lines_sampling_fields_reach_a_remote_server_too():
    from localinfer.request.sampling import SamplingOptions
    from localinfer.remote.client import request_body

    item = parse_input(b'{"prompt": "x", "presence_penalty": 0.5, "repeat_last_n": 32, "top_k": 7}', "jsonl")[0]
    assert isinstance(item, BatchRequest)
    body = request_body("m", prompt="x", sampling=item.sampling_over(SamplingOptions()))
    assert (body["presence_penalty"], body["repeat_last_n"], body["top_k"]) == (0.5, 32, 7)
    plain = request_body("m", prompt="x", sampling=SamplingOptions())
    assert not {"presence_penalty", "frequency_penalty", "repeat_last_n", "top_k"} & set(plain)


def test_template_kwargs_reasoning_format_and_past_thinking():
    assert rules.chat_template_kwargs("f", {"enable_thinking": False}) == {"enable_thinking": False}
    assert rules.chat_template_kwargs("f", {}) is None and rules.chat_template_kwargs("f", None) is None
    for bad, needle in (([1], "must be an object"), ({"add_generation_prompt": True}, "may not set 'add_generation_prompt'")):
        with pytest.raises(rules.RuleError, match=needle):
            rules.chat_template_kwargs("chat_template_kwargs", bad)
    with pytest.raises(rules.RuleError, match="is not valid JSON"):
        rules.chat_template_kwargs_text("--chat-template-kwargs", "{enable_thinking: false}")
    assert rules.reasoning_format("r", "none") == "none"
    with pytest.raises(rules.RuleError, match="must be one of auto, deepseek, none"):
        rules.reasoning_format("reasoning_format", "hidden")
    kept = rules.message("m", {"role": "assistant", "content": "4", "reasoning_content": "2+2"})
    assert kept == {"role": "assistant", "content": "4", "reasoning_content": "2+2"}
    with pytest.raises(rules.RuleError, match="has 'reasoning_content'"):
        rules.message("m", {"role": "user", "content": "x", "reasoning_content": "no"})
