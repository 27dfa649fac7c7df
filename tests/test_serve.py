"""`localinfer serve` without a model: the request checks, the answer shapes, the metrics text, the
bridge from the engine thread, and the HTTP layer driven over ASGI with a scripted engine."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

pytest.importorskip("starlette")

from localinfer.engine.slots import common_prefix
from localinfer.engine.types import GenerationStats
from localinfer.request.sampling import SamplingOptions
from localinfer.serve.http.app import ServerState, create_app
from localinfer.serve.scheduler.bridge import Channel, Hub
from localinfer.serve.config import ServeConfig
from localinfer.serve.scheduler.worker import Ended, Overloaded, Prepared
from localinfer.serve.http.metrics import Gauges, Metrics
from localinfer.serve.wires.openai import ApiError, parse_body, parse_request
from localinfer.serve.wires.chat_completions import CompletionWriter

HI = [{"role": "user", "content": "hi"}]


# -- protocol ---------------------------------------------------------------------------------------------
def test_a_chat_request_becomes_sampling_options_and_limits():
    r = parse_request({"model": "m", "messages": HI, "temperature": 0, "top_p": 0.5, "seed": 7, "stop": "\n",
                       "max_completion_tokens": 9, "stream": True, "stream_options": {"include_usage": True},
                       "presence_penalty": 0.5, "user": "u", "n": 1, "logprobs": False}, "chat")  # fmt: skip
    q = r.request  # the core request; streaming is the wire's
    assert q.sampling == SamplingOptions(temperature=0.0, top_p=0.5, seed=7, presence_penalty=0.5)
    assert (q.max_tokens, q.stop, r.stream, r.include_usage, q.sampling.presence_penalty) == (9, ("\n",), True, True, 0.5)
    assert q.messages == ({"role": "user", "content": "hi"},)


def test_message_forms():
    r = parse_request({"messages": [{"role": "developer", "content": "be brief"},
                                    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
                      "chat")  # fmt: skip
    assert r.request.messages == ({"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"})
    assert parse_request({"prompt": ["one prompt"]}, "text").request.raw_text == "one prompt"
    assert parse_request({"prompt": [1, 2, 3]}, "text").prompt_ids == (1, 2, 3)


@pytest.mark.parametrize(
    ("body", "kind", "param", "code"),
    [
        ({"messages": HI, "temprature": 1}, "chat", "temprature", "unknown_parameter"),
        ({"messages": HI, "echo": True}, "chat", "echo", "unknown_parameter"),  # a completions field
        ({"prompt": "x", "messages": HI}, "text", "messages", "unknown_parameter"),
        ({}, "chat", "messages", "missing_parameter"),
        ({"messages": []}, "chat", "messages", "invalid_type"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "chat", "messages[0].tool_call_id", "invalid_type"),
        ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "c9"}]}, "chat", "messages[0].tool_call_id", "invalid_value"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "chat", "messages[0].role", "invalid_value"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "chat", "messages[0].content[0]", "invalid_value"),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "chat", "messages[0]", "unsupported_parameter"),
        ({"messages": HI, "max_tokens": 1.5}, "chat", "max_tokens", "invalid_type"),
        ({"messages": HI, "max_tokens": 0}, "chat", "max_tokens", "invalid_value"),
        ({"messages": HI, "max_tokens": True}, "chat", "max_tokens", "invalid_type"),
        ({"messages": HI, "temperature": "0"}, "chat", "temperature", "invalid_type"),
        ({"messages": HI, "temperature": 3}, "chat", "temperature", "invalid_value"),
        ({"messages": HI, "seed": -1}, "chat", "seed", "invalid_value"),
        ({"messages": HI, "stop": ["a"] * 17}, "chat", "stop", "invalid_value"),
        ({"messages": HI, "stop": [1]}, "chat", "stop", "invalid_type"),
        ({"messages": HI, "n": 2}, "chat", "n", "unsupported_parameter"),
        ({"messages": HI, "logprobs": True, "top_logprobs": 21}, "chat", "top_logprobs", "invalid_value"),
        ({"messages": HI, "logprobs": 3}, "chat", "logprobs", "invalid_type"),  # chat's is true or false
        ({"messages": HI, "top_logprobs": 2}, "chat", "top_logprobs", "invalid_value"),  # without logprobs: true
        ({"prompt": "x", "logprobs": 21}, "text", "logprobs", "invalid_value"),
        ({"messages": HI, "tools": [{"type": "function"}]}, "chat", "tools[0].function", "invalid_type"),
        ({"messages": HI, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
         "chat", "tools[0].function.parameters", "invalid_value"),
        ({"messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": {"type": "function", "function": {"name": "g"}}}, "chat", "tool_choice.function.name", "invalid_value"),
        ({"messages": HI, "tool_choice": "required"}, "chat", "tool_choice", "invalid_value"),
        ({"messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "maybe"},
         "chat", "tool_choice", "invalid_value"),
        ({"messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}], "parallel_tool_calls": 1},
         "chat", "parallel_tool_calls", "invalid_type"),
        ({"prompt": "x", "tools": []}, "text", "tools", "unknown_parameter"),
        ({"messages": HI, "stream": True, "stream_options": {"x": 1}}, "chat", "stream_options", "unknown_parameter"),
        ({"messages": HI, "max_tokens": 3, "max_completion_tokens": 4}, "chat", "max_tokens", "invalid_value"),
        ({"prompt": ""}, "text", "prompt", "invalid_value"),
        ({"prompt": [[1, 2]]}, "text", "prompt", "invalid_type"),
        ({"prompt": "x", "suffix": "y"}, "text", "suffix", "unsupported_parameter"),
    ],
)
def test_bad_fields_are_named(body, kind, param, code):
    with pytest.raises(ApiError) as info:
        parse_request(body, kind)
    assert info.value.status == 400 and info.value.param == param and info.value.code == code
    assert info.value.body()["error"]["message"]


def test_stream_options_without_a_stream_is_accepted_and_ignored():
    # llama-server's lenience (issue 40): the options of a stream that is not asked for ask for nothing
    for stream in (False, None):
        body = {"messages": HI, "stream_options": {"include_usage": True}, **({} if stream is None else {"stream": stream})}
        req = parse_request(body, "chat")
        assert not req.stream and not req.include_usage
    assert parse_request({"messages": HI, "stream": True, "stream_options": {"include_usage": True}}, "chat").include_usage
    with pytest.raises(ApiError):  # still checked: a bad value is refused whether or not it streams
        parse_request({"messages": HI, "stream_options": {"include_usage": 1}}, "chat")


def test_bodies_that_are_not_json_objects():
    for raw in (b"{", b"[]", b"\xff", b"null"):
        with pytest.raises(ApiError) as info:
            parse_body(raw)
        assert info.value.code == "invalid_json"


# -- answers --------------------------------------------------------------------------------------------
def _outcome(text: str = "Hello", reason: str = "stop", **stats: Any) -> Ended:
    s = GenerationStats(prompt_tokens=10, cached_tokens=4, completion_tokens=3, prefill_s=0.06, decode_s=0.02, **stats)
    return Ended(text, reason, s, queue_s=0.001, ttft_s=0.07, total_s=0.09)


def test_chunks_share_id_and_created_and_end_with_usage_and_done():
    a = CompletionWriter.new("chat", "m", include_usage=True)
    before, after = a.text_chunks()
    spliced = before + json.dumps("é\n\"x").encode() + after
    assert json.loads(spliced[6:]) == json.loads(a.chunk("é\n\"x")[6:])  # the fast path is the same JSON
    events = [json.loads(e[6:]) for e in a.last_chunks(_outcome()).split(b"\n\n") if e and e != b"data: [DONE]"]
    assert a.last_chunks(_outcome()).endswith(b"data: [DONE]\n\n")
    finish, usage = events
    assert finish["choices"][0]["finish_reason"] == "stop" and finish["usage"] is None
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}
    assert {finish["id"], usage["id"]} == {a.id} and a.id.startswith("chatcmpl-")


def test_whole_answers_carry_usage_and_llama_server_timings():
    body = CompletionWriter.new("text", "m").whole(_outcome())
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "Hello"
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
                             "prompt_tokens_details": {"cached_tokens": 4}}  # fmt: skip
    t = body["timings"]
    assert (t["cache_n"], t["prompt_n"], t["predicted_n"]) == (4, 6, 3)
    assert t["prompt_per_second"] == 100.0 and t["predicted_per_second"] == 100.0


# -- metrics ----------------------------------------------------------------------------------------------
def test_metrics_text():
    m = Metrics()
    m.answered("chat", 200)
    m.answered("chat", 400)
    m.finished(_outcome())
    text = m.render(Gauges(running=2, queued=1, kv_cells_used=30, kv_cells=2048, ready=True))
    assert 'localinfer_requests_total{endpoint="chat",status="400"} 1' in text
    assert "localinfer_prompt_tokens_cached_total 4" in text and "localinfer_completion_tokens_total 3" in text
    assert 'localinfer_time_to_first_token_seconds_bucket{le="0.05"} 0' in text
    assert 'localinfer_time_to_first_token_seconds_bucket{le="0.1"} 1' in text
    assert 'localinfer_time_to_first_token_seconds_bucket{le="+Inf"} 1' in text
    assert "localinfer_requests_queued 1" in text and "localinfer_kv_cache_used_cells 30" in text
    assert "# TYPE localinfer_time_per_output_token_seconds histogram" in text


# -- the bridge ---------------------------------------------------------------------------------------------
def test_pieces_from_another_thread_arrive_whole_and_in_order():
    async def main() -> tuple[str, Any]:
        channel: Channel[str] = Channel(Hub(asyncio.get_running_loop()))

        def engine() -> None:
            for i in range(2000):
                channel.push(f"{i},")
            channel.close("end")

        threading.Thread(target=engine).start()
        text, end = "", None
        while end is None:
            piece, end = await channel.get()
            text += piece
        return text, end

    text, end = asyncio.run(main())
    assert text == "".join(f"{i}," for i in range(2000)) and end == "end"


def test_common_prefix():
    a = list(range(1000))
    assert common_prefix(a, a, 999) == 999
    assert common_prefix(a, [*a[:700], -1], 5000) == 700
    assert common_prefix([], a, 10) == 0


class _Cells:
    """What a SlotTable asks of the model: every cache drop succeeds (and is written down)."""

    n_ctx_seq = 512
    per_token_cells = True  # False: a recurrent model's state

    def __init__(self) -> None:
        self.dropped: list[int] = []
        self.cut: list[tuple[int, int]] = []

    def first_position(self, seq: int) -> int:
        return 0

    def drop_tokens(self, seq: int, n: int) -> bool:
        self.cut.append((seq, n))
        return True

    def drop_sequence(self, seq: int) -> None:
        self.dropped.append(seq)


class _Done:
    """A finished slot: its prompt and the cells its answer added."""

    def __init__(self, prompt: list[int], answered: int) -> None:
        from localinfer.engine.types import SeqJob

        self.seq, self.job, self.pos = 0, SeqJob("done", prompt, None), len(prompt) + answered  # type: ignore[arg-type]
        self.gen = [7] * answered

    def cached_tokens(self) -> list[int]:
        return [*self.job.tokens, *self.gen][: self.pos]


def test_a_slot_reuses_a_cached_prompt_leaving_its_last_rows_to_evaluate():
    from localinfer.engine.rows import EXACT_ROWS
    from localinfer.engine.slots import SlotTable

    prompt = list(range(1, 201))
    cells = _Cells()
    table = SlotTable(cells, 1, keep_cache=True)  # type: ignore[arg-type]
    assert table.take(prompt) == (0, 0)
    table.release(_Done(prompt, 3))  # type: ignore[arg-type]
    assert cells.cut == [(0, 200)] and table.kept[0] == prompt  # the answer's cells went: decoded a row at a time
    assert table.take([*prompt, 9, 9]) == (0, 202 - EXACT_ROWS)  # a short turn: its last rows as a cold prompt's
    table.release(_Done(prompt, 3))  # type: ignore[arg-type]
    assert table.take([*prompt, *[9] * EXACT_ROWS]) == (0, 200)  # the whole prompt, not the answer
    table.release(_Done(prompt, 3))  # type: ignore[arg-type]
    assert table.take(prompt, reuse=False) == (0, 0)  # cache_prompt: false
    assert table.kept[0] == [] and 0 in cells.dropped
    short = list(range(1, EXACT_ROWS))  # evaluated in one short piece: not as a longer prompt's start is
    table.release(_Done(short, 3))  # type: ignore[arg-type]
    assert table.kept[0] == [] and table.take([*short, *prompt]) == (0, 0)


def test_a_recurrent_models_slot_reuses_all_but_one_token_and_its_answer():
    from localinfer.engine.slots import SlotTable

    cells = _Cells()
    cells.per_token_cells = False  # its state cannot go back: nothing to evaluate again
    table = SlotTable(cells, 1, keep_cache=True)  # type: ignore[arg-type]
    table.take([1, 2, 3, 4, 5])
    table.release(_Done([1, 2, 3, 4, 5], 2))  # type: ignore[arg-type]
    assert cells.cut == [] and table.kept[0] == [1, 2, 3, 4, 5, 7, 7]
    assert table.take([1, 2, 3, 4, 5, 7, 7, 8]) == (0, 7)


def test_a_prompt_is_cut_so_every_ubatch_holds_enough_of_its_rows():
    from localinfer.engine.rows import EXACT_ROWS, prompt_chunk

    for n_ubatch in (512, 128):
        for left in range(1, 2600):
            for room in (2048, 2040, 600, 300, 2 * EXACT_ROWS):
                pieces, rest = [], left
                while rest:
                    k = prompt_chunk(rest, room, n_ubatch)
                    assert 0 < k <= min(rest, room), (left, room, rest, k)
                    pieces += [n_ubatch] * (k // n_ubatch) + ([k % n_ubatch] if k % n_ubatch else [])
                    rest -= k
                assert min(pieces) >= min(left, EXACT_ROWS), (left, room, pieces)
    assert prompt_chunk(530, 2048, 512) == 466  # then 64: not 512 and 18
    assert prompt_chunk(100, 2048, 512) == 100 and prompt_chunk(30, 2048, 512) == 30
    assert prompt_chunk(300, 40, 512) == 0  # a batch nearly full of next tokens: wait for room
    assert prompt_chunk(300, 40, 32) == 40  # ubatches too small for the rule


# -- the HTTP layer, with a scripted engine ------------------------------------------------------------------
class FakeEngine:
    """Answers every request with ``pieces`` from a thread, as the engine would."""

    n_ctx_seq, parallel, running, queued, cells_used, cells_total = 512, 2, 0, 0, 0, 1024
    prompt_cache = None  # the figures of a host prompt cache: none here
    vision = False  # a text model: no projector

    def __init__(self, pieces: tuple[str, ...] = ("Hel", "lo"), full: bool = False) -> None:
        self.pieces, self.full = pieces, full
        self.cancelled = threading.Event()

    def prepare(self, request: Any, clamp: bool = False) -> Prepared:
        return Prepared(request, [1, 2, 3], ())

    def submit(self, prepared: Prepared, on_text: Any, on_end: Any, on_reasoning: Any = None, **_: Any) -> Any:
        if self.full:
            raise Overloaded()

        def run() -> None:
            for p in self.pieces:
                if on_text:
                    on_text(p)
            on_end(_outcome("".join(self.pieces), "length"))

        threading.Thread(target=run).start()
        return self

    def cancel(self) -> None:
        self.cancelled.set()


def call(state: ServerState, method: str, path: str, body: Any = None, headers: dict[str, str | None] | None = None,
         raw: bytes | None = None) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    """One request through the ASGI app: (status, headers, body). A POST says its body is JSON, as
    clients do, unless ``headers`` gives another Content-Type (None: none at all)."""
    data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
    given = {"content-type": "application/json"} if method == "POST" else {}
    given.update({k.lower(): v for k, v in (headers or {}).items()})

    async def main() -> list[dict[str, Any]]:
        state.hub = Hub(asyncio.get_running_loop())
        app = create_app(state)
        hdrs = [(k.encode(), v.encode()) for k, v in given.items() if v is not None]
        where, _, query = path.partition("?")
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
                 "path": where, "raw_path": where.encode(), "query_string": query.encode(), "root_path": "", "client": ("127.0.0.1", 9),
                 "server": ("127.0.0.1", 80), "headers": [*hdrs, (b"content-length", str(len(data)).encode())]}  # fmt: skip
        received, sent = asyncio.Event(), []

        async def receive() -> dict[str, Any]:
            if not received.is_set():
                received.set()
                return {"type": "http.request", "body": data, "more_body": False}
            await asyncio.Event().wait()  # the client stays
            return {}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)
        return sent

    sent = asyncio.run(main())
    head = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    return sent[0]["status"], head, b"".join(m.get("body", b"") for m in sent[1:])


def _state(engine: Any = None, **config: Any) -> ServerState:
    return ServerState.holding(ServeConfig(**config), ("m", "m.gguf"), engine)


def test_answers_streamed_and_whole():
    state = _state(FakeEngine())
    status, headers, body = call(state, "POST", "/v1/chat/completions", {"messages": HI, "stream": True})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [json.loads(e[6:]) for e in body.decode().split("\n\n") if e.startswith("data: {")]
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"]) == "Hello"
    assert body.endswith(b"data: [DONE]\n\n")
    status, headers, body = call(state, "POST", "/v1/completions", {"prompt": "x", "model": "m.gguf"})
    assert status == 200 and json.loads(body)["choices"][0]["text"] == "Hello"
    assert json.loads(body)["model"] == "m"


@pytest.mark.parametrize(
    ("state_kw", "method", "path", "body", "headers", "status", "code"),
    [
        ({}, "POST", "/v1/chat/completions", {"messages": HI, "model": "other.gguf"}, {}, 404, "model_not_found"),
        ({}, "POST", "/v1/chat/completions", None, {}, 400, "invalid_json"),
        ({}, "GET", "/v1/nothing", None, {}, 404, "not_found"),
        ({}, "GET", "/v1/chat/completions", None, {}, 405, "method_not_allowed"),
        ({"api_key": "k"}, "POST", "/v1/chat/completions", {"messages": HI}, {}, 401, "invalid_api_key"),
        ({"api_key": "k"}, "GET", "/metrics", None, {"Authorization": "Bearer x"}, 401, "invalid_api_key"),
        ({"api_key": "k"}, "GET", "/v1/models", None, {"Authorization": "Basic k"}, 401, "invalid_api_key"),
        ({"max_body": 1024}, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 2000}]}, {}, 413, "request_too_large"),
    ],
)
def test_errors_are_json_with_the_right_status(state_kw, method, path, body, headers, status, code):
    got, _, data = call(_state(FakeEngine(), **state_kw), method, path, body, headers)
    assert got == status, data
    assert json.loads(data)["error"]["code"] == code


def test_loading_and_overloaded_are_503_with_retry_after():
    status, _, data = call(_state(None), "GET", "/health")
    assert status == 503 and json.loads(data)["error"]["code"] == "model_loading"
    status, headers, _ = call(_state(None), "POST", "/v1/chat/completions", {"messages": HI})
    assert status == 503 and headers["retry-after"] == "1"
    status, headers, data = call(_state(FakeEngine(full=True)), "POST", "/v1/chat/completions", {"messages": HI})
    assert status == 503 and headers["retry-after"] == "1" and json.loads(data)["error"]["code"] == "server_overloaded"
    assert call(_state(FakeEngine()), "GET", "/health")[0] == 200


def test_the_right_key_passes():
    state = _state(FakeEngine(), api_key="k")
    assert call(state, "POST", "/v1/completions", {"prompt": "x"}, {"Authorization": "Bearer k"})[0] == 200
    assert call(state, "GET", "/health")[0] == 200  # probes need no key


# -- the command ---------------------------------------------------------------------------------------------
@pytest.mark.llama
def test_help_and_missing_packages():
    out = subprocess.run([sys.executable, "-m", "localinfer", "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for flag in ("--host", "--port", "--parallel", "--api-key", "--max-queue", "--max-body", "--ctx-size", "--cache-type-k"):
        assert flag in out.stdout
    code = "import sys; sys.modules['uvicorn'] = None; from localinfer.cli.main import main; main()"
    proc = subprocess.run([sys.executable, "-c", code, "serve"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    # The hint is a command this copy's user can run: from this checkout, its path (not an index name).
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    expected = "pip install " + ("-e " if _editable() else "") + f"'{root}[serve]'"
    assert f"hint: {expected}" in proc.stderr and "Traceback" not in proc.stderr


def _editable() -> bool:
    import importlib.metadata

    return '"editable": true' in (importlib.metadata.distribution("localinfer").read_text("direct_url.json") or "")


def test_the_serve_hint_names_the_index_package_when_not_installed_from_a_checkout(monkeypatch):
    import importlib.metadata

    from localinfer.cli.extras import pip_install

    class FromIndex:
        def read_text(self, name):
            return None  # pip writes direct_url.json only for a URL or a path

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: FromIndex())
    assert pip_install("serve") == "pip install 'localinfer[serve]'"


def test_the_cli_does_not_import_the_server_stack():
    code = "import sys, localinfer.cli.main; print(sorted({'starlette', 'uvicorn', 'anyio'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_a_port_in_use_is_a_usage_error(smollm2_path, isolated_home):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "localinfer", "serve", "--port", str(port), "-m", str(smollm2_path)],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in proc.stderr


def test_a_model_that_cannot_load_stops_the_server_with_its_exit_code(smollm2_path, isolated_home):
    """The socket is bound first (/health says 503); a load that fails ends the command with the
    error table's code (6: memory), not a server left running without a model."""
    env = {**os.environ, "LOCALINFER_FAKE_RAM": str(10**9)}
    proc = subprocess.run([sys.executable, "-m", "localinfer", "serve", "--port", "0", "-m", str(smollm2_path), "-np", "16", "-c", "8192"],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert proc.returncode == 6, proc.stderr
    assert "listening on http://127.0.0.1:" in proc.stderr and "not enough memory" in proc.stderr


@pytest.mark.llama
def test_another_host_without_a_key_is_warned_about(tmp_path, isolated_home):
    """Checked before anything is bound (the missing model then ends the command): no socket opens."""
    args = ["serve", "--host", "0.0.0.0", "-m", str(tmp_path / "missing.gguf")]
    proc = subprocess.run([sys.executable, "-m", "localinfer", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "without --api-key" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "localinfer", *args, "--api-key", "k"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "without --api-key" not in proc.stderr


def test_a_step_takes_every_queued_request_and_waits_for_none():
    """llama-server's policy (issue 52): the requests queued when a step is filled all go into it
    (their first tokens come after that one step), and one not queued yet - even one being prepared -
    is not waited for: it joins the next step. An idle engine used to hold its first step up to 50 ms
    for the rest of a burst, which made the burst's first requests wait for the last ones' prompts."""
    from types import SimpleNamespace

    from localinfer.serve.scheduler.worker import Engine

    loaded = SimpleNamespace(name="m", model=SimpleNamespace(n_ctx_seq=64), template=None)

    def ticket(key: str) -> Any:
        return SimpleNamespace(key=key, job=key, cancelled=threading.Event())

    decoder = SimpleNamespace(n_active=0, stats=SimpleNamespace(steps=0))
    engine = Engine(loaded, 4, max_queue=4)  # type: ignore[arg-type]
    source = engine._source(decoder)  # type: ignore[arg-type]
    for key in "abc":
        engine._queue.put(ticket(key))
    threading.Timer(0.015, engine._queue.put, args=(ticket("d"),)).start()
    got = [next(source)]
    decoder.n_active = 1
    got += [next(source), next(source), next(source)]  # the step's admission: until None
    assert got == ["a", "b", "c", None]
    time.sleep(0.05)
    assert next(source) == "d"  # the next step's
