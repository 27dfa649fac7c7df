"""--endpoint against a scripted stub server on 127.0.0.1 (tests/stubserver.py): the client's parsing
and metrics, run/chat/batch/bench through the CLI, every fault a clear error (exit 5) and, in
batch, nothing lost. No model is loaded here; the real servers are in test_remote_server.py."""

from __future__ import annotations

import json
import math
import re
import sqlite3
import time

import pytest
from stubserver import StubServer
from typer.testing import CliRunner

from localinfer.cli.main import build_app
from localinfer.remote import loadtest, metrics
from localinfer.remote.client import StreamState
from localinfer.remote.connection import (
    ProtocolError,
    RemoteError,
    endpoint,
    retry_after_s,
)
from localinfer.remote.sse import SSEDecoder

runner = CliRunner()


@pytest.fixture(autouse=True)
def no_remote_env(monkeypatch):
    for name in ("LOCALINFER_ENDPOINT", "LOCALINFER_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def stub():
    with StubServer(tokens=4) as s:
        yield s


def cli(*args: str, input: str | None = None):
    return runner.invoke(build_app(), list(args), input=input)


# -- units -----------------------------------------------------------------------------------------


def test_sse_decoder_follows_the_spec():
    d = SSEDecoder()
    assert d.feed(": ping") is None and d.feed("event: x") is None and d.feed("data: a") is None
    assert d.feed("data:b") is None and d.feed("id: 3") is None
    assert d.feed("") == ("x", "a\nb")
    assert d.feed("") is None and not d.pending()


def test_stream_state_measures_and_refuses_malformed_events():
    st = StreamState("http://h/v1", t_start=10.0)
    st.line('data: {"choices":[{"delta":{"role":"assistant","content":null}}]}', 10.1)
    st.line("", 10.1)
    for i, t in enumerate((10.5, 10.7, 11.0)):
        st.line('data: {"choices":[{"delta":{"content":"x%d"}}]}' % i, t)
        st.line("", t)
    st.line('data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}', 11.0)
    st.line("", 11.0)
    st.line("data: [DONE]", 11.1)
    st.line("", 11.1)
    o = st.finish(11.2)
    assert o.text == "x0x1x2" and o.prompt_tokens == 7 and o.completion_tokens == 3
    assert o.ttft_s == pytest.approx(0.5) and o.itl == pytest.approx([0.2, 0.3]) and o.total_s == pytest.approx(1.2)
    assert o.decode_tps == pytest.approx(2 / 0.5)
    bad = StreamState("http://h/v1", 0.0)
    bad.line("data: {not json", 0.1)
    with pytest.raises(ProtocolError, match="not JSON"):
        bad.line("", 0.1)
    cut = StreamState("http://h/v1", 0.0)
    cut.line('data: {"choices":[{"delta":{"content":"a"}}]}', 0.1)
    with pytest.raises(RemoteError, match="closed the stream in the middle of an event"):
        cut.finish(0.2)


def test_unknown_counts_stay_unknown():
    st = StreamState("h", 0.0)
    for t in (0.1, 0.2):
        st.line('data: {"choices":[{"delta":{"content":"a"}}]}', t)
        st.line("", t)
    st.line("data: [DONE]", 0.3)
    st.line("", 0.3)
    o = st.finish(0.3)
    assert o.completion_tokens is None and o.prompt_tokens is None and o.decode_tps is None


def test_endpoint_url_and_key(monkeypatch):
    assert endpoint("http://127.0.0.1:8080").base_url == "http://127.0.0.1:8080/v1"
    assert endpoint("https://u:p@h:9/v1/").display == "https://h:9/v1"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    assert endpoint("http://h/v1").api_key == "sk-env" and endpoint("http://h/v1", "k").api_key == "k"
    res = cli("run", "--endpoint", "ftp://h", "-p", "hi")
    assert res.exit_code == 2 and "--endpoint must be an http(s) URL" in res.output
    assert retry_after_s("3") == 3.0 and retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


def test_arrivals_are_poisson_and_keep_the_rate():
    offs = loadtest.arrival_offsets(2000, 50.0, 1.0, seed=1)
    assert offs[-1] == pytest.approx(2000 / 50.0)
    gaps = [b - a for a, b in zip(offs, offs[1:])]
    mean = sum(gaps) / len(gaps)
    cv = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps)) / mean
    assert cv == pytest.approx(1.0, abs=0.1)  # exponential gaps: coefficient of variation 1
    even = loadtest.arrival_offsets(2000, 50.0, 100.0, seed=1)
    egaps = [b - a for a, b in zip(even, even[1:])]
    assert max(egaps) < 3 * min(egaps)  # gamma shape 100: nearly regular
    assert loadtest.arrival_offsets(3, math.inf, 1.0, 0) == [0.0, 0.0, 0.0]


def test_metrics_follow_vllm_definitions():
    outs = [
        loadtest.RequestOutput(True, 0.0, 0.1, [0.05, 0.05], 0.2, 10, 3),
        loadtest.RequestOutput(True, 0.1, 0.3, [0.1], 0.5, 12, 2),
        loadtest.RequestOutput(False, 0.2, None, [], 0.01, None, None, error="boom"),
    ]
    r = metrics.compute(outs, 2.0, percentiles=(50, 99), slos={"ttft": 200, "tpot": 60})
    assert (r["completed"], r["failed"], r["total_input_tokens"], r["total_output_tokens"]) == (2, 1, 22, 5)
    assert r["request_throughput"] == 1.0 and r["output_throughput"] == 2.5
    assert r["mean_ttft_ms"] == pytest.approx(200) and r["median_ttft_ms"] == pytest.approx(200)
    assert r["mean_tpot_ms"] == pytest.approx((50 + 200) / 2)  # (e2el - ttft) / (n - 1)
    assert r["mean_itl_ms"] == pytest.approx(200 / 3) and r["p99_e2el_ms"] == pytest.approx(200 + 300 * 0.99)
    assert r["request_goodput"] == 0.5 and r["max_concurrent_requests"] == 2
    assert metrics.parse_slos(["ttft:500,tpot:50", "e2el:2000"]) == {"ttft": 500, "tpot": 50, "e2el": 2000}
    with pytest.raises(Exception, match="NAME:MS"):
        metrics.parse_slos(["latency:5"])


# -- run ---------------------------------------------------------------------------------------------


def test_run_streams_the_answer_and_records_it(stub):
    res = cli("run", "--endpoint", stub.url, "-p", "hello", "-n", "3", "--temperature", "0")
    assert res.exit_code == 0, res.output
    assert res.stdout == "t0 t1 t2 \n"
    assert "stub-model @ " + stub.url in res.stderr and "3 tokens" in res.stderr
    body = stub.bodies[-1]
    assert body["stream"] and body["stream_options"] == {"include_usage": True} and body["max_tokens"] == 3
    assert body["messages"] == [{"role": "user", "content": "hello"}] and "top_k" not in body
    stats = cli("stats", "--json")
    model = json.loads(stats.stdout)["models"][0]
    assert model["model"] == "stub-model" and model["endpoint"] == stub.url and model["requests"] == 1


def test_a_broken_history_is_one_warning_from_the_command(stub, isolated_home):
    from localinfer.usage import history

    isolated_home.mkdir(parents=True, exist_ok=True)
    history.db_path().write_bytes(b"garbage" * 1000)
    res = cli("run", "--endpoint", stub.url, "-p", "hello", "-n", "2")
    assert res.exit_code == 0 and res.stdout == "t0 t1 \n"
    assert res.stderr.count("warning: could not record this request in the usage history") == 1, res.stderr
    lines = '{"prompt": "a"}\n{"prompt": "b"}\n'
    res = cli("batch", "--endpoint", stub.url, "-n", "2", "--quiet", "-", input=lines)
    assert res.exit_code == 0 and res.stdout.count("\n") == 2
    assert "warning: could not record" in res.stderr, res.stderr


def test_run_json_has_the_local_keys(stub):
    res = cli("run", "--endpoint", stub.url, "-m", "other", "-p", "hi", "--json", "-n", "2")
    obj = json.loads(res.stdout)
    assert obj["model"] == "other" and obj["endpoint"] == stub.url and obj["text"] == "t0 t1 "
    assert obj["usage"]["completion_tokens"] == 2 and obj["timings"]["ttft_ms"] > 0
    assert obj["timings"]["load_ms"] is None and obj["usage"]["prompt_eval_tokens"] is None


def test_run_without_usage_says_unknown(stub):
    stub.plan.append("nousage")
    res = cli("run", "--endpoint", stub.url, "-p", "hi", "-n", "2")
    assert res.exit_code == 0 and "unknown tokens" in res.stderr and "prompt unknown" in res.stderr


@pytest.mark.parametrize(
    ("behaviour", "message"),
    [
        ("401", r"refused the request \(401\)"),
        ("429", r"is busy \(429\)"),
        ("malformed", "malformed event"),
        ("die", "broke during the answer|closed the stream before the answer ended"),
        ("cut", "broke during the answer|in the middle of an event"),
        ("404", r"not found \(404\)"),
    ],
)
def test_run_faults_exit_5_with_the_url(stub, behaviour, message):
    stub.plan.append(behaviour)
    res = cli("run", "--endpoint", stub.url, "-p", "hi")
    assert res.exit_code == 5, res.output
    assert re.search(message, res.stderr) and stub.url in res.stderr and "hint:" in res.stderr


def test_run_server_down_and_slow_server():
    res = cli("run", "--endpoint", "http://127.0.0.1:9/v1", "-m", "x", "-p", "hi")
    assert res.exit_code == 5 and "cannot connect to http://127.0.0.1:9/v1" in res.stderr and "is the server running" in res.stderr
    with StubServer() as stub:
        stub.plan.append("hang")
        res = cli("run", "--endpoint", stub.url, "-m", "x", "-p", "hi", "--timeout", "0.5")
        # The stub never answers: only our own --timeout can have ended the request.
        assert res.exit_code == 5 and "sent nothing for 0.5 s" in res.stderr and "--timeout" in res.stderr


def test_api_key_is_sent(stub, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    assert cli("run", "--endpoint", stub.url, "-m", "x", "-p", "hi").exit_code == 0
    assert stub.last_headers["authorization"] == "Bearer sk-env"
    assert cli("run", "--endpoint", stub.url, "-m", "x", "-p", "hi", "--api-key", "sk-flag").exit_code == 0
    assert stub.last_headers["authorization"] == "Bearer sk-flag"


# -- chat ----------------------------------------------------------------------------------------------


def test_chat_piped_keeps_the_conversation(stub):
    res = cli("chat", "--endpoint", stub.url, "-n", "2", "-s", "be brief", input="first\n/set temperature 0\nsecond\n/stats\n")
    assert res.exit_code == 0, res.output
    assert res.stdout.count("t0 t1 ") == 2
    last = stub.bodies[-1]["messages"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user"] and last[-1]["content"] == "second"
    assert stub.bodies[-1]["temperature"] == 0 and "turns" in res.stderr


# -- batch ---------------------------------------------------------------------------------------------


def _requests(tmp_path, n: int):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"req {i}"}) + "\n" for i in range(n)))
    return path


def _ids(path):
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_batch_retries_busy_and_broken_requests(stub, tmp_path):
    stub.retry_after = "0.5"
    stub.by_prompt.update({"req 1": ["429", "ok"], "req 2": ["die", "ok"], "req 3": ["503", "ok"]})
    out = tmp_path / "out.jsonl"
    t0 = time.monotonic()
    res = cli("batch", str(_requests(tmp_path, 6)), "-o", str(out), "--endpoint", stub.url, "--parallel", "3", "-n", "4")
    assert res.exit_code == 0, res.output
    assert time.monotonic() - t0 >= 0.5  # Retry-After was honoured
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == [f"r{i}" for i in range(6)]
    assert all("error" not in r and r["text"] == "t0 t1 t2 t3 " and r["usage"]["completion_tokens"] == 4 for r in records)
    assert stub.requests == 6 + 3


def test_batch_gives_up_with_an_error_record_then_resume_finishes(stub, tmp_path):
    stub.by_prompt["req 2"] = ["malformed"]
    stub.by_prompt["req 4"] = ["429"]
    stub.retry_after = "0"
    out = tmp_path / "out.jsonl"
    inp = _requests(tmp_path, 5)
    res = cli("batch", str(inp), "-o", str(out), "--endpoint", stub.url, "--retries", "2", "--keep-order")
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == ["r0", "r1", "r2", "r3", "r4"]
    assert "malformed event" in records[2]["error"] and "after 3 tries" in records[4]["error"]
    assert "2 errors" in res.stderr
    stub.by_prompt.clear()
    res = cli("batch", str(inp), "-o", str(out), "--endpoint", stub.url, "--resume")
    assert res.exit_code == 0, res.output
    assert sorted(_ids(out)) == [f"r{i}" for i in range(5)]
    assert all("error" not in json.loads(line) for line in out.read_text().splitlines())


def test_batch_stops_on_a_refused_key_and_loses_nothing(stub, tmp_path):
    stub.plan.extend(["401"] * 20)
    out = tmp_path / "out.jsonl"
    inp = _requests(tmp_path, 4)
    res = cli("batch", str(inp), "-o", str(out), "--endpoint", stub.url, "-m", "x")
    assert res.exit_code == 5 and "refused the request (401)" in res.stderr and "--api-key" in res.stderr
    stub.plan.clear()
    res = cli("batch", str(inp), "-o", str(out), "--endpoint", stub.url, "--resume")
    assert res.exit_code == 0 and sorted(_ids(out)) == ["r0", "r1", "r2", "r3"]


def test_batch_history_marks_the_endpoint(stub, tmp_path, isolated_home):
    cli("batch", str(_requests(tmp_path, 3)), "-o", str(tmp_path / "o.jsonl"), "--endpoint", stub.url)
    rows = sqlite3.connect(isolated_home / "history.db").execute("SELECT command, model, endpoint FROM requests").fetchall()
    assert rows == [("batch", "stub-model", stub.url)] * 3


# -- bench (the load test) -------------------------------------------------------------------------


def test_load_test_json_uses_vllm_keys(stub):
    res = cli("bench", "--endpoint", stub.url, "--requests", "20", "--rate", "200", "--input-len", "8",
              "--output-len", "3", "--percentiles", "50,90,99", "--slo", "ttft:1000", "-o", "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    for key in ("completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput",
                "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "p90_tpot_ms", "mean_itl_ms", "p50_e2el_ms", "request_goodput"):  # fmt: skip
        assert key in r, key
    assert r["completed"] == 20 and r["failed"] == 0 and r["total_output_tokens"] == 60
    assert r["request_goodput"] == pytest.approx(r["request_throughput"])
    assert all(b["ignore_eos"] and b["max_tokens"] == 3 for b in stub.bodies)
    assert stub.requests == 21  # the probe, then the test


@pytest.mark.llama
def test_load_test_counts_failures_and_checks_flags(stub):
    stub.plan.extend(["ok", "500"])  # the probe passes, one request of the test fails
    res = cli("bench", "--endpoint", stub.url, "--requests", "5", "--input-len", "4", "-o", "json")
    r = json.loads(res.stdout)
    assert (r["completed"], r["failed"]) == (4, 1) and sum("(500)" in e for e in r["errors"]) == 1
    assert cli("bench", "--rate", "3").exit_code == 2
    assert cli("bench", "--endpoint", stub.url, "-p", "512").exit_code == 2
    assert cli("bench", "--endpoint", stub.url, "--rate", "-1").exit_code == 2


def test_sweep_writes_a_self_contained_report(stub, tmp_path):
    report = tmp_path / "r.html"
    res = cli("bench", "--endpoint", stub.url, "--requests", "10", "--sweep", "50,100,inf", "--input-len", "4",
              "--output-len", "2", "--report", str(report), "-o", "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    results = json.loads(res.stdout)
    assert [r["request_rate"] for r in results] == [50.0, 100.0, "inf"]
    page = report.read_text()
    assert page.count("<svg") == 6 and not re.search(r"<script|<link|src=|href=|url\(", page)


# -- the shape of the package --------------------------------------------------------------------------


def test_history_schema_1_is_read_and_migrated(isolated_home):
    from localinfer.usage import history

    isolated_home.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(isolated_home / "history.db")
    old = history._SCHEMA[0].replace(",\n    endpoint TEXT", "")
    conn.execute(old)
    conn.execute("INSERT INTO requests (ts, command, model) VALUES (1.0, 'run', 'm')")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    assert [r.endpoint for r in history.load_records()] == [None]
    history.append(history.UsageRecord(command="run", model="m", endpoint="http://h/v1"))
    assert [r.endpoint for r in history.load_records()] == [None, "http://h/v1"]


def test_remote_code_is_not_imported_by_the_cli():
    import subprocess
    import sys

    code = "import sys, localinfer.cli.main as m; m.build_app(); print(sorted(n for n in sys.modules if n.startswith(('httpx', 'localinfer.remote'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_run_ctrl_c_keeps_the_partial_answer_and_exits_130():
    import os
    import signal
    import subprocess
    import sys

    with StubServer(tokens=50, token_delay=0.2) as stub:
        env = {k: v for k, v in os.environ.items() if k != "LOCALINFER_ENDPOINT"}
        proc = subprocess.Popen([sys.executable, "-m", "localinfer", "run", "--endpoint", stub.url, "-p", "hi"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)  # fmt: skip
        first = proc.stdout.read(3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and first == b"t0 "
    assert (first + out).endswith(b"\n") and b"finish interrupted" in err and b"Error: interrupted" in err


def test_run_raw_sends_the_system_prompt_as_run_raw_does_here(stub):
    # One request builder: --raw --system was the text alone on a server, "{system}\n\n{text}" here.
    res = cli("run", "--endpoint", stub.url, "--raw", "-s", "You are terse.", "-p", "Once", "-n", "2")
    assert res.exit_code == 0, res.output
    body = stub.bodies[-1]
    assert body["prompt"] == "You are terse.\n\nOnce" and "messages" not in body and body["max_tokens"] == 2


@pytest.mark.llama
def test_batch_json_lines_have_the_same_keys_here_and_on_a_server(stub, tmp_path, fake_backend, smollm2_path):  # noqa: F811
    reqs = tmp_path / "r.jsonl"
    reqs.write_text('{"id": "a", "prompt": "Hi"}\n', encoding="utf-8")
    remote = cli("batch", str(reqs), "--endpoint", stub.url, "-n", "2", "-q")
    local = cli("batch", str(reqs), "-m", str(smollm2_path), "-n", "2", "-q", "--no-log")
    assert remote.exit_code == 0 and local.exit_code == 0, remote.output + local.output
    there, here = json.loads(remote.stdout), json.loads(local.stdout)

    def shape(obj):
        return {k: sorted(v) if isinstance(v, dict) else None for k, v in obj.items()}

    assert shape(there) == shape(here) and there["id"] == here["id"] == "a"
    assert here["usage"]["completion_tokens"] == there["usage"]["completion_tokens"] == 2
