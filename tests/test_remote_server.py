"""--endpoint against real servers on 127.0.0.1, started here with SmolLM2: llama.cpp's llama-server
(built from the vendored source by benchmarks/build_native.sh, which .ci/run runs) and our own
`localinfer serve`. Greedy text equals a local run's; a killed batch resumes with every id once;
the load test's counts and TTFT agree with what llama-server reports itself."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import run_cli

pytestmark = pytest.mark.slow

NATIVE_BIN = Path(os.environ.get("LLAMA_NATIVE_BIN", Path(__file__).resolve().parents[1] / "benchmarks" / ".build" / "bin"))
LLAMA_SERVER = NATIVE_BIN / "llama-server"
PROMPT = "Name three colors."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(base: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not become healthy")


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _repack_flag() -> tuple[str, ...]:
    """llama-server repacks weights as localinfer would: not on AMX CPUs, where llama.cpp's AMX
    kernels die with SIGILL/SIGSEGV on the first batch (engine.backend.cpu_repack_enabled)."""
    from localinfer.engine.backend import cpu_repack_enabled

    return () if cpu_repack_enabled(None) else ("--no-repack",)


@pytest.fixture(scope="module")
def llama_server(smollm2_path, tmp_path_factory):
    if not os.access(LLAMA_SERVER, os.X_OK):
        pytest.skip(f"{LLAMA_SERVER} is not built: bash benchmarks/build_native.sh builds it (.ci/run does)")
    port = _free_port()
    log = open(tmp_path_factory.mktemp("llama-server") / "log.txt", "w")
    proc = subprocess.Popen(
        [str(LLAMA_SERVER), "-m", str(smollm2_path), "--host", "127.0.0.1", "--port", str(port), "-c", "2048",
         "-np", "2", "--metrics", "-t", "2", *_repack_flag()],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base, proc)
        yield base + "/v1"
    finally:
        _stop(proc)
        log.close()


@pytest.fixture(scope="module")
def localinfer_serve(smollm2_path, tmp_path_factory):
    if not (Path(__file__).resolve().parents[1] / "src" / "localinfer" / "cli" / "serve.py").exists():
        pytest.skip("localinfer serve is not there yet")
    home = tmp_path_factory.mktemp("serve-home")
    env = {**os.environ, "LOCALINFER_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "-m", "localinfer", "serve", "-m", str(smollm2_path), "--port", "0", "--offline",
                             "--parallel", "2", "--no-log"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    port = None
    deadline = time.monotonic() + 120
    while port is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            pytest.fail(f"localinfer serve exited ({proc.returncode})")
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        port = int(m.group(1)) if m else None
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base, proc)
        yield base + "/v1"
    finally:
        _stop(proc)


def _greedy(*args: str) -> str:
    res = run_cli("run", "-p", PROMPT, "-n", "24", "--temperature", "0", "-q", "--no-log", *args)
    assert res.returncode == 0, res.stderr.decode()
    return res.stdout.decode()


def test_run_endpoint_gives_the_local_greedy_text(llama_server, localinfer_serve, smollm2_path):
    local = _greedy("-m", str(smollm2_path))
    assert local.strip()
    assert _greedy("--endpoint", llama_server) == local  # llama-server renders the same GGUF template
    assert _greedy("--endpoint", localinfer_serve) == local


def test_batch_endpoint_resumes_after_a_kill(llama_server, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    n = 6
    inp.write_text("".join(json.dumps({"id": i, "prompt": f"Count from {i} to {i + 20}."}) + "\n" for i in range(n)))
    args = [sys.executable, "-m", "localinfer", "batch", str(inp), "-o", str(out), "--endpoint", llama_server,
            "--parallel", "2", "-n", "16", "--temperature", "0", "-q"]  # fmt: skip
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not (out.exists() and out.read_bytes().count(b"\n") >= 1):
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    before = out.read_bytes().count(b"\n") if out.exists() else 0
    assert 1 <= before < n  # killed in the middle of the job
    res = subprocess.run([*args, "--resume"], stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr.decode()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == list(range(n))
    assert all("error" not in r and r["usage"]["completion_tokens"] for r in records)


def test_load_test_agrees_with_the_server(llama_server):
    res = run_cli("bench", "--endpoint", llama_server, "--requests", "6", "--input-len", "24", "--output-len", "8",
                  "--max-concurrency", "2", "--percentiles", "50,99", "-o", "json", "--no-log")  # fmt: skip
    assert res.returncode == 0, res.stderr.decode()
    r = json.loads(res.stdout)
    server = r["server"]
    delta = server["metrics_delta"]
    assert (r["completed"], r["failed"], server["responses_with_timings"]) == (6, 0, 6)
    # token counts: usage == the per-response timings == the /metrics counters (exactly)
    assert r["total_output_tokens"] == 6 * 8 == server["predicted_n"] == delta["llamacpp:tokens_predicted_total"]
    assert r["total_input_tokens"] == server["prompt_n"] + server["cache_n"]
    assert r["total_input_tokens"] == delta["llamacpp:prompt_tokens_total"] + delta["llamacpp:prompt_tokens_cached_total"]
    # TTFT on the client includes the server's prompt processing and comes before the request's end
    # (no bound in ms: a busy machine stretches both; which chunk TTFT is taken at is pinned with
    # scripted times in test_remote.test_stream_state_measures_and_refuses_malformed_events).
    assert server["mean_prompt_ms"] <= r["mean_ttft_ms"] < r["mean_e2el_ms"], (r["mean_ttft_ms"], server)


def test_load_test_against_localinfer_serve(localinfer_serve):
    res = run_cli("bench", "--endpoint", localinfer_serve, "--requests", "4", "--input-len", "16", "--output-len", "6",
                  "-o", "json", "--no-log")  # fmt: skip
    assert res.returncode == 0, res.stderr.decode()
    r = json.loads(res.stdout)
    assert (r["completed"], r["failed"], r["total_output_tokens"]) == (4, 0, 24)
    assert r["ignore_eos"] is True and r["mean_ttft_ms"] > 0
