"""`localinfer serve` for real: a subprocess on 127.0.0.1 with the SmolLM2 test model, driven by the
official ``openai`` client and by raw HTTP; and the engine's prefix reuse and cancellation in process."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

from localinfer.engine.rows import EXACT_ROWS

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")

_LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


class ServeProcess:
    def __init__(self, model: Path | None, *args: str, home: Path, env: dict[str, str] | None = None, timeout: float = 120) -> None:
        full_env = {k: v for k, v in os.environ.items() if k != "LOCALINFER_API_KEY"}
        full_env.update({"LOCALINFER_HOME": str(home), "HF_HUB_OFFLINE": "1", **(env or {})})
        cmd = [sys.executable, "-m", "localinfer", "serve", *(["-m", str(model)] if model is not None else []), "--port", "0", "--offline", *args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)
        self.lines: list[str] = []
        self._port: int | None = None
        self._seen = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        self.port = self._wait_port(timeout)
        self.base = f"http://127.0.0.1:{self.port}"
        self.wait_ready(timeout)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._seen:
                self.lines.append(line)
                m = _LISTENING.search(line)
                if m:
                    self._port = int(m.group(1))
                self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def _wait_port(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        with self._seen:
            while self._port is None:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"serve did not start:\n{self.stderr}")
                self._seen.wait(0.2)
            return self._port

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, _, _ = self.request("GET", "/health")
            if status == 200:
                return
            assert self.proc.poll() is None, self.stderr
            time.sleep(0.1)
        raise AssertionError(f"/health never answered 200:\n{self.stderr}")

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                raw: bytes | None = None) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
        """One HTTP request: (status, headers, body bytes)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
            conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def json(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        status, _, data = self.request(method, path, body, headers)
        return status, json.loads(data)

    def metrics(self, headers: dict[str, str] | None = None) -> dict[str, float]:
        """The /metrics samples by name (labels included), e.g. ``m['localinfer_requests_running']``."""
        status, _, data = self.request("GET", "/metrics", headers=headers)
        assert status == 200, data
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# -- fixtures ---------------------------------------------------------------------------------------
GREEDY = {"temperature": 0}
HI = [{"role": "user", "content": "Say hello in one short sentence."}]
# a system prompt longer than the last rows a reused prompt evaluates again (EXACT_ROWS), as an agent's is
RULES = {"role": "system", "content": "You are terse. " + " ".join(f"Rule {i}: answer in plain words." for i in range(16))}


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    """One server for the module's protocol tests: 4 sequences of 512 tokens, no key."""
    with ServeProcess(smollm2_path, "-np", "4", "-c", "512", home=tmp_path_factory.mktemp("serve-home")) as s:
        yield s


@pytest.fixture(scope="module")
def strict(smollm2_path, tmp_path_factory):
    """A server with a key, one sequence, a queue of one and a small body limit."""
    args = ("-np", "1", "--max-queue", "1", "--max-body", "4096", "-c", "512", "--api-key", "s3cret")
    with ServeProcess(smollm2_path, *args, home=tmp_path_factory.mktemp("strict-home")) as s:
        yield s


def client(s: ServeProcess, key: str = "unused") -> Any:
    return openai.OpenAI(base_url=s.base + "/v1", api_key=key, max_retries=0, timeout=120)


def model_name(s: ServeProcess, headers: dict[str, str] | None = None) -> str:
    status, body = s.json("GET", "/v1/models", headers=headers)
    assert status == 200, body
    return body["data"][0]["id"]


def sse_events(s: ServeProcess, path: str, body: dict) -> list[Any]:
    """The ``data:`` payloads of an SSE answer, parsed (``[DONE]`` kept as the string)."""
    status, headers, data = s.request("POST", path, body)
    assert status == 200, data
    assert headers["content-type"].startswith("text/event-stream")
    events = []
    for block in data.decode().split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            payload = block[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


# -- health, models, metrics ------------------------------------------------------------------------------
def test_health_models_and_metrics(server):
    assert server.json("GET", "/health") == (200, {"status": "ok"})
    name = model_name(server)
    assert name == str(Path(name)) and name.endswith(".gguf")  # a path model: named as given
    m = server.metrics()
    assert m["localinfer_ready"] == 1
    assert m["localinfer_kv_cache_cells"] == 4 * 512
    for key in ("localinfer_requests_running", "localinfer_requests_queued", "localinfer_kv_cache_used_cells",
                "localinfer_prompt_tokens_total", "localinfer_completion_tokens_total",
                'localinfer_time_to_first_token_seconds_bucket{le="+Inf"}',
                'localinfer_time_per_output_token_seconds_bucket{le="+Inf"}'):  # fmt: skip
        assert key in m, key


# -- the OpenAI client ---------------------------------------------------------------------------------------
def test_chat_with_the_openai_client_whole_and_streamed(server):
    c, name = client(server), model_name(server)
    whole = c.chat.completions.create(model=name, messages=[RULES, *HI], max_tokens=12, **GREEDY)
    text = whole.choices[0].message.content
    assert text and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.id.startswith("chatcmpl-") and whole.object == "chat.completion"
    assert whole.usage.prompt_tokens > 0 and whole.usage.completion_tokens <= 12
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    timings = whole.model_extra["timings"]
    assert timings["predicted_n"] == whole.usage.completion_tokens
    assert timings["prompt_n"] + timings["cache_n"] == whole.usage.prompt_tokens
    assert {"prompt_ms", "predicted_per_second"} <= set(timings)

    chunks = list(c.chat.completions.create(model=name, messages=[RULES, *HI], max_tokens=12, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))  # fmt: skip
    assert len({ch.id for ch in chunks}) == 1 and len({ch.created for ch in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == text  # greedy: the same answer
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == whole.usage.completion_tokens
    # the same prompt again: its slot held it, and its last rows are evaluated as a cold prompt's
    assert last.usage.prompt_tokens_details.cached_tokens == last.usage.prompt_tokens - EXACT_ROWS > 0
    assert all(ch.usage is None for ch in chunks[:-1])


def test_completions_with_the_openai_client(server):
    c, name = client(server), model_name(server)
    whole = c.completions.create(model=name, prompt="The capital of France is", max_tokens=6, **GREEDY)
    assert whole.object == "text_completion" and whole.choices[0].text
    assert whole.choices[0].finish_reason in ("stop", "length")
    streamed = list(c.completions.create(model=name, prompt="The capital of France is", max_tokens=6, stream=True, **GREEDY))
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == whole.choices[0].text
    assert streamed[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_the_sse_wire_format(server):
    body = {"messages": HI, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}, **GREEDY}
    events = sse_events(server, "/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len({(e["id"], e["created"], e["model"], e["object"]) for e in chunks}) == 1
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and "timings" in chunks[-2]
    assert "cached_tokens" in chunks[-1]["usage"]["prompt_tokens_details"]


def test_eight_concurrent_clients_decode_together(server):
    """8 streaming clients on 4 sequences: every answer is the one it gets alone (greedy), and the
    engine ran several at once."""
    c, name = client(server), model_name(server)
    prompts = [f"Name a {w}." for w in ("fruit", "colour", "city", "river", "planet", "tree", "bird", "metal")]

    def ask(prompt: str) -> str:
        stream = c.chat.completions.create(model=name, messages=[{"role": "user", "content": prompt}], max_tokens=8,
                                           stream=True, **GREEDY)  # fmt: skip
        return "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)

    before = server.metrics()
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, prompts))
    after = server.metrics()
    assert after['localinfer_requests_total{endpoint="chat",status="200"}'] - before.get('localinfer_requests_total{endpoint="chat",status="200"}', 0) == 8
    assert all(together)
    alone = [ask(p) for p in prompts[:3]]
    assert alone == together[:3]


def test_a_second_chat_turn_evaluates_only_the_new_tokens(server):
    c, name = client(server), model_name(server)
    turn1 = [RULES, {"role": "user", "content": "Name a colour."}]
    first = c.chat.completions.create(model=name, messages=turn1, max_tokens=8, **GREEDY)
    turn2 = [*turn1, {"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "And another one?"}]  # fmt: skip
    second = c.chat.completions.create(model=name, messages=turn2, max_tokens=8, **GREEDY)
    cached = second.usage.prompt_tokens_details.cached_tokens
    # the first turn's prompt, not the answer's cells (decoded a row at a time), and not the last rows
    assert cached == min(first.usage.prompt_tokens, second.usage.prompt_tokens - EXACT_ROWS) > 0
    assert second.model_extra["timings"]["cache_n"] == cached
    assert second.model_extra["timings"]["prompt_n"] == second.usage.prompt_tokens - cached


def test_a_client_that_goes_away_frees_its_sequence_at_once(server):
    body = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True}
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.readline().startswith(b"data: ")  # it is generating
    before = server.metrics()
    assert before["localinfer_requests_running"] >= 1
    conn.sock.close()  # the client goes away mid-answer
    conn.close()
    deadline = time.monotonic() + 10
    while (m := server.metrics())["localinfer_requests_running"] > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert m["localinfer_requests_running"] == 0
    assert m['localinfer_requests_finished_total{reason="interrupted"}'] >= 1
    assert m["localinfer_completion_tokens_total"] - before["localinfer_completion_tokens_total"] < 400
    c = client(server)
    assert c.completions.create(model=model_name(server), prompt="Hello", max_tokens=3).choices[0].text is not None


# -- errors ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "code", "needle"),
    [
        (b"{not json", "invalid_json", "not valid JSON"),
        (b"[1, 2]", "invalid_json", "JSON object"),
        (json.dumps({"messages": HI, "temprature": 0.5}).encode(), "unknown_parameter", "temprature"),
        (json.dumps({"messages": HI, "max_tokens": "12"}).encode(), "invalid_type", "max_tokens"),
        (json.dumps({"messages": HI, "temperature": True}).encode(), "invalid_type", "temperature"),
        (json.dumps({"messages": "hi"}).encode(), "invalid_type", "messages"),
        (json.dumps({"messages": HI, "n": 2}).encode(), "unsupported_parameter", "'n'"),
        (json.dumps({"messages": [{"role": "user", "content": "hi " * 600}], "max_tokens": 5}).encode(), "context_length_exceeded", "512 tokens"),
    ],
)
def test_bad_requests_are_400_with_a_message(server, body, code, needle):
    status, headers, data = server.request("POST", "/v1/chat/completions", raw=body)
    assert status == 400, data
    err = json.loads(data)["error"]
    assert err["code"] == code and needle in err["message"] and err["type"] == "invalid_request_error"


def test_max_tokens_past_the_context_is_lowered_to_what_the_prompt_leaves_on_every_wire(server):
    # was a 400 on Chat Completions (OpenAI's way); llama-server and Ollama lower it, as our Anthropic
    # route did: agents ask for 8k-64k knowing no context (Qwen Code retries a cut answer with 64k)
    long = [{"role": "user", "content": "hello " * 430}]
    status, body = server.json("POST", "/v1/chat/completions", {"messages": long, "max_tokens": 100000, "ignore_eos": True, **GREEDY})
    assert status == 200, body
    usage = body["usage"]
    assert usage["prompt_tokens"] > 400 and usage["prompt_tokens"] + usage["completion_tokens"] == 512, usage
    assert body["choices"][0]["finish_reason"] == "length"
    name = model_name(server)
    for path, asked in (("/v1/responses", {"input": "Hi", "max_output_tokens": 100000, **GREEDY}),
                        ("/api/chat", {"model": name, "messages": HI, "stream": False, "options": {"num_predict": 100000, **GREEDY}})):  # fmt: skip
        status, body = server.json("POST", path, asked)
        assert status == 200, (path, body)


def test_an_unknown_model_is_404_and_nothing_is_opened(server, tmp_path):
    with pytest.raises(openai.NotFoundError) as info:
        client(server).chat.completions.create(model=str(tmp_path / "other.gguf"), messages=HI, max_tokens=2)
    assert info.value.code == "model_not_found"
    assert not (tmp_path / "other.gguf").exists()


def test_a_key_is_required_when_set(strict):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        status, body = strict.json("POST", "/v1/chat/completions", {"messages": HI}, headers)
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        client(strict, "wrong").models.list()
    assert strict.json("GET", "/health")[0] == 200  # probes need no key
    answer = client(strict, "s3cret").completions.create(model=model_name(strict, AUTH), prompt="Hi", max_tokens=2)
    assert answer.usage.completion_tokens <= 2


AUTH = {"Authorization": "Bearer s3cret"}


def test_a_body_over_the_limit_is_413(strict):
    big = {"messages": [{"role": "user", "content": "x" * 5000}]}
    status, body = strict.json("POST", "/v1/chat/completions", big, AUTH)
    assert status == 413 and body["error"]["code"] == "request_too_large"


def test_a_full_queue_is_503_with_retry_after(strict):
    """One sequence, a queue of one: a third request while one runs and one waits is refused."""
    long = json.dumps({"prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True, "stream": True})
    conns = []
    try:
        for _ in range(2):
            conn = http.client.HTTPConnection("127.0.0.1", strict.port, timeout=60)
            conn.request("POST", "/v1/completions", body=long, headers={"Content-Type": "application/json", **AUTH})
            conns.append(conn)
            if len(conns) == 1:
                assert conn.getresponse().readline().startswith(b"data: ")  # running
        deadline = time.monotonic() + 10
        while strict.metrics(AUTH)["localinfer_requests_queued"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        status, headers, data = strict.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2}, AUTH)
        assert status == 503 and headers["retry-after"] == "1"
        assert json.loads(data)["error"]["code"] == "server_overloaded"
    finally:
        for conn in conns:
            conn.close()


# -- the process ------------------------------------------------------------------------------------------------
def test_sigterm_drains_exits_0_and_stats_show_serve(smollm2_path, tmp_path):
    home = tmp_path / "home"
    with ServeProcess(smollm2_path, "-np", "2", "-c", "256", home=home) as s:
        events: list[Any] = []
        streaming = threading.Thread(target=lambda: events.extend(
            sse_events(s, "/v1/completions", {"prompt": "Once", "max_tokens": 24, "ignore_eos": True, "stream": True})))
        streaming.start()
        deadline = time.monotonic() + 30
        while s.metrics()["localinfer_requests_running"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert s.stop() == 0, s.stderr
        streaming.join(30)
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"  # it finished
    assert "Traceback" not in s.stderr
    proc = run_cli("stats", "--json", env={"LOCALINFER_HOME": str(home)})
    assert proc.returncode == 0, proc.stderr
    (entry,) = json.loads(proc.stdout)["models"]
    assert entry["commands"] == ["serve"] and entry["requests"] >= 1 and entry["tokens_out"] >= 24
    only = {c: json.loads(run_cli("stats", "--json", "--command", c, env={"LOCALINFER_HOME": str(home)}).stdout)
            for c in ("serve", "run")}  # fmt: skip
    assert only["serve"]["models"] == [entry] and only["run"]["models"] == []


def test_cache_prompt_false_evaluates_the_whole_prompt(server):
    """llama-server's per-request switch: no prefix is reused, whatever the cache holds."""
    body = {"messages": [RULES, {"role": "user", "content": "Count to three, please."}], "max_tokens": 4, **GREEDY}
    assert server.json("POST", "/v1/chat/completions", body)[0] == 200
    status, fresh = server.json("POST", "/v1/chat/completions", {**body, "cache_prompt": False})
    assert status == 200 and fresh["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert fresh["timings"]["cache_n"] == 0 and fresh["timings"]["prompt_n"] == fresh["usage"]["prompt_tokens"]
    status, reused = server.json("POST", "/v1/chat/completions", body)
    assert status == 200 and reused["usage"]["prompt_tokens_details"]["cached_tokens"] == reused["usage"]["prompt_tokens"] - EXACT_ROWS > 0


def test_what_real_clients_send_is_answered(server):
    """A hard-coded model name and the fields OpenAI's and llama.cpp's clients add (issue 31)."""
    answer = client(server).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, store=False, user="u",
        metadata={"run": "1"}, service_tier="auto", parallel_tool_calls=False, **GREEDY,
    )  # fmt: skip
    assert answer.choices[0].message.content is not None and answer.model == model_name(server)
    status, body = server.json("POST", "/v1/completions", {"prompt": "The sea is", "n_predict": 3, **GREEDY})
    assert status == 200 and body["usage"]["completion_tokens"] == 3


def test_greedy_output_equals_run(server, smollm2_path):
    """The same prompt, greedy: `run` (one sequence) and serve (the batch engine) say the same."""
    prompt = "Write one sentence about the sea."
    proc = run_cli("run", "-m", str(smollm2_path), "-p", prompt, "--temperature", "0", "-n", "16", "--no-log", "-q",
                   env={"LOCALINFER_HOME": str(Path(os.environ["LOCALINFER_HOME"]))})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    answer = client(server).chat.completions.create(model=model_name(server), messages=[{"role": "user", "content": prompt}],
                                                    max_tokens=16, **GREEDY)  # fmt: skip
    assert proc.stdout.decode().rstrip("\n") == answer.choices[0].message.content.rstrip("\n")


# -- the engine underneath: prefix reuse and cancellation ------------------------------------------------------
def _loaded(path: Path, parallel: int, ctx: int) -> Any:
    from localinfer.generate import loading
    from localinfer.batch import job as batchjob
    from localinfer.engine.types import LoadOptions
    from localinfer.store import resolve_model

    return loading.load(resolve_model(str(path)), batchjob.batch_load_options(LoadOptions(n_threads=2), parallel=parallel, ctx_per_seq=ctx))


def test_a_reused_prefix_gives_the_answer_a_fresh_cache_gives(smollm2_path):
    from localinfer.engine.batch import BatchDecoder, SeqJob
    from localinfer.request.sampling import SamplingOptions

    greedy = SamplingOptions(temperature=0.0)
    loaded = _loaded(smollm2_path, 2, 512)
    try:
        model = loaded.model
        paint = " ".join(f"Tube {i} of the paint box is {c}." for i, c in enumerate(["red", "blue", "yellow", "black"] * 3))
        first = model.tokenize(paint + " The three primary colors are")
        more = " red, blue and yellow. " + " ".join(f"Mixing {a} and {b} gives a new color." for a, b in (("red", "blue"), ("blue", "yellow"), ("red", "yellow"), ("black", "red"), ("black", "blue"), ("black", "yellow")))
        second = first + model.tokenize(more + " Two more colors are", add_special=False)
        assert len(second) - len(first) >= EXACT_ROWS  # so all of the first prompt is reused
        done: dict[str, Any] = {}

        def jobs():  # the second job comes once the first has finished, as a chat's next turn
            yield SeqJob("first", first, greedy, max_tokens=6, ignore_eos=True)
            while "first" not in done:
                yield None
            yield SeqJob("second", second, greedy, max_tokens=10, ignore_eos=True)

        with BatchDecoder(model, 2, keep_cache=True) as decoder:
            for r in decoder.run(jobs()):
                done[r.key] = r
        with BatchDecoder(model, 2) as fresh:
            (alone,) = fresh.run([SeqJob("second", second, greedy, max_tokens=10, ignore_eos=True)])
    finally:
        loaded.close()
    reused = done["second"]
    assert reused.stats.cached_tokens == len(first) and alone.stats.cached_tokens == 0
    assert decoder.stats.cached_tokens == reused.stats.cached_tokens
    assert decoder.stats.prompt_tokens == len(first) + len(second) - reused.stats.cached_tokens
    assert reused.text == alone.text


def test_a_cancelled_sequence_ends_at_the_next_step_and_its_slot_serves_again(smollm2_path):
    from localinfer.engine.batch import BatchDecoder, SeqJob
    from localinfer.request.sampling import SamplingOptions

    loaded = _loaded(smollm2_path, 1, 256)
    stop = threading.Event()
    pieces: list[str] = []

    def on_text(text: str) -> None:
        pieces.append(text)
        if len(pieces) == 3:
            stop.set()

    try:
        prompt = loaded.model.tokenize("Once upon a time" + ", in a land far away, there lived a king" * 8)
        jobs = [SeqJob("cancelled", prompt, SamplingOptions(temperature=0.0), max_tokens=200, ignore_eos=True, on_text=on_text, cancel=stop),
                SeqJob("next", prompt, SamplingOptions(temperature=0.0), max_tokens=4, ignore_eos=True)]  # fmt: skip
        with BatchDecoder(loaded.model, 1, keep_cache=True) as decoder:
            results = {r.key: r for r in decoder.run(jobs)}
    finally:
        loaded.close()
    cancelled = results["cancelled"]
    assert cancelled.stats.finish_reason == "interrupted" and cancelled.stats.completion_tokens == 3
    assert cancelled.text == "".join(pieces)
    assert results["next"].stats.completion_tokens == 4 and results["next"].stats.cached_tokens == len(prompt) - EXACT_ROWS > 0


def test_a_sliding_window_model_reuses_a_prefix_longer_than_its_window(gemma_path):
    """Gemma 3's sliding-window layers see 512 positions; our contexts keep a full-size SWA cache
    (llama.cpp's default context parameters), so a prefix longer than the window is still whole and
    reused - and the answers are those a fresh cache gives. (Were cells forgotten, the slot table
    would evaluate the prompt again: ``slots._complete``.)"""
    import random

    from localinfer.engine.batch import BatchDecoder, SeqJob
    from localinfer.request.sampling import SamplingOptions

    greedy = SamplingOptions(temperature=0.0)
    loaded = _loaded(gemma_path, 1, 1024)
    try:
        model = loaded.model
        rng = random.Random(0)
        short = model.tokenize("The three primary colors are")
        long = [model.bos_token] + [rng.randrange(1000, 30000) for _ in range(700)]
        more = model.tokenize(" and then" * EXACT_ROWS, add_special=False)  # the last rows to evaluate are all new
        jobs = [SeqJob(k, t, greedy, max_tokens=4, ignore_eos=True)
                for k, t in (("short", short), ("short+", short + more), ("long", long), ("long+", long + more))]  # fmt: skip
        with BatchDecoder(model, 1, keep_cache=True) as decoder:
            reused = {r.key: r for r in decoder.run(jobs)}
        with BatchDecoder(model, 1) as decoder:
            fresh = {r.key: r for r in decoder.run(jobs)}
    finally:
        loaded.close()
    assert reused["short+"].stats.cached_tokens == 0  # evaluated in one short piece, as no longer prompt's start is
    assert reused["long+"].stats.cached_tokens == len(long)
    assert {k: r.text for k, r in reused.items()} == {k: r.text for k, r in fresh.items()}


def test_ctrl_c_when_idle_exits_0_at_once(smollm2_path, tmp_path):
    # "At once": with nothing running it does not sit out the drain, here longer than the wait allows.
    with ServeProcess(smollm2_path, "-np", "1", "-c", "128", "--no-log", "--drain-timeout", "3600", home=tmp_path) as s:
        s.proc.send_signal(signal.SIGINT)
        assert s.proc.wait(120) == 0, s.stderr
    assert "stopping:" not in s.stderr and "Traceback" not in s.stderr


def test_without_c_each_sequence_gets_the_trained_context_and_says_so(gemma_path, tmp_path):
    # an agent's 21k-token prompt must fit by default: Gemma-3-270M is trained on 32768 (run's default: 4096)
    with ServeProcess(gemma_path, "-np", "2", home=tmp_path) as s:
        assert "context: 32768 tokens per sequence x 2 (the 32768 tokens the model was trained on" in s.stderr
        status, body = s.json("GET", "/v1/models")
        assert status == 200 and body["data"][0]["meta"]["n_ctx_seq"] == 32768
        status, body = s.json("GET", "/api/ps")
        assert body["models"][0]["context_length"] == 32768
        prompt = "word " * 4300  # past run's 4096: answered, not a 400
        status, body = s.json("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 1})
        assert status == 200 and body["usage"]["prompt_tokens"] > 4096, body
