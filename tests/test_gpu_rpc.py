"""GPU offload for real, through llama.cpp's RPC backend: to llama.cpp a ggml-rpc-server is a GPU
with its own memory, so every offload path runs end to end without a GPU.

Needs a llama-cpp-python built with -DGGML_RPC=ON and servers built from the same source; .ci/rpc
sets both up and runs ``LOCALINFER_TEST_RPC=127.0.0.1:P1,127.0.0.1:P2 python -m pytest -m gpu
tests/test_gpu_rpc.py``. Skipped when LOCALINFER_TEST_RPC is not set. ``LOCALINFER_TEST_CPU_PYTHON``
(the main venv's python) makes the CPU-only build the reference for the text; else this build
without --rpc. A server serves one client at a time: each command runs in its own process, in turn.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.gpu,
    # decided at collection, before the session's model fixtures are built for nothing
    pytest.mark.skipif(not os.environ.get("LOCALINFER_TEST_RPC"), reason="LOCALINFER_TEST_RPC names no ggml-rpc-server (.ci/rpc starts them)"),
]

# llama.cpp repacks some weight types (Q4_K, Q4_0, Q8_0...) for the local CPU's fastest kernels, and
# an RPC server's buffers are plain CPU memory that never is: Gemma's Q4_K layers then round
# differently and a near-tie can flip. Without repacking both sides run the same kernels, and the
# text is bit-identical (SmolLM2's Q4_1 has no repacked kernels: equal either way, tested below).
GREEDY = ("--temperature", "0", "--seed", "1", "--no-log", "-t", "1", "--no-cpu-repack")
PROMPT = "The three primary colors are"
LAYERS = {"smollm2": 31, "gemma": 19}  # what llama.cpp offloads: repeating layers + the output layer


@pytest.fixture(scope="module")
def servers() -> tuple[str, ...]:
    return tuple(e.strip() for e in os.environ["LOCALINFER_TEST_RPC"].split(",") if e.strip())


@pytest.fixture(params=["smollm2", "gemma"])
def model(request, smollm2_path, gemma_path) -> tuple[str, str]:
    return request.param, str(smollm2_path if request.param == "smollm2" else gemma_path)


def _cli(*args: str, python: str | None = None, env: dict | None = None, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python or sys.executable, "-m", "localinfer", *args], input=input,
        stdin=subprocess.DEVNULL if input is None else None, capture_output=True,
        env={**os.environ, "LOCALINFER_RPC": "", **(env or {})}, timeout=300, check=False,
    )  # fmt: skip


def _ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return proc


def _run_json(path: str, *args: str, **kw) -> dict:
    return json.loads(_ok(_cli("run", "--json", "--raw", "-m", path, "-n", "12", "-c", "512", *GREEDY, *args, "-p", PROMPT, **kw)).stdout)


_reference: dict[str, str] = {}


def _cpu_text(name: str, path: str) -> str:
    """The greedy answer of the CPU-only build (no --rpc, no offload; no repacking, see GREEDY)."""
    if name not in _reference:
        python = os.environ.get("LOCALINFER_TEST_CPU_PYTHON") or None
        _reference[name] = _run_json(path, "-ngl", "0", python=python)["text"]
    return _reference[name]


def _rpc_bytes(data: dict) -> list[int]:
    return [n for dev, n in data["offload"]["devices"].items() if dev.startswith("RPC")]


def test_doctor_lists_the_remote_devices_and_their_memory(servers):
    data = json.loads(_ok(_cli("doctor", "--json", "--rpc", ",".join(servers))).stdout)
    remote = [d for d in data["llama_cpp"]["devices"] if d["backend"] == "RPC"]
    assert [d["description"] for d in remote] == list(servers)
    assert all(d["type"] == "gpu" and d["total_bytes"] >= d["free_bytes"] > 0 for d in remote)
    assert data["comfortable_model"]["where"] == "the RPC servers' memory"
    assert not {"gpu_not_visible", "rpc_only"} & {a["kind"] for a in data["advice"]}
    text = _ok(_cli("doctor", "--rpc", servers[0])).stdout.decode()
    assert re.search(rf"device +RPC0 \(RPC\): {re.escape(servers[0])} · [\d.]+ [GM]B \([\d.]+ [GM]B free\)", text)
    alone = _ok(_cli("doctor")).stdout.decode()  # an RPC-only build without servers: no driver to check
    assert "pass --rpc HOST:PORT" in alone and "nvidia-smi" not in alone


def test_an_unreachable_server_is_one_line_and_exit_5(servers, smollm2_path):
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
    proc = _cli("run", "-m", str(smollm2_path), "-n", "2", "-p", "hi", "--rpc", f"127.0.0.1:{port}")
    assert proc.returncode == 5 and proc.stdout == b""
    error, hint = proc.stderr.decode().splitlines()
    assert error.startswith(f"Error: cannot reach the RPC server at 127.0.0.1:{port}: ")
    assert f"ggml-rpc-server -H <address> -p {port}" in hint


@pytest.mark.parametrize("mode", ["auto", "all", "10", "0"])
def test_run_offloads_as_asked_and_answers_as_the_cpu_does(servers, model, mode):
    name, path = model
    data = _run_json(path, "--rpc", servers[0], "-ngl", mode)
    expected = {"auto": LAYERS[name], "all": LAYERS[name], "10": 10, "0": 0}[mode]
    assert data["offload"]["gpu_layers"] == expected and data["offload"]["layers"] == LAYERS[name]
    assert data["offload"]["gpu_offload_supported"] is True
    assert (len(_rpc_bytes(data)) == 1 and _rpc_bytes(data)[0] > 0) if expected else _rpc_bytes(data) == []
    assert data["timings"]["load_ms"] > 0 and data["memory"]["llama_cpp"]["weights_bytes"] > 0
    assert data["text"] == _cpu_text(name, path)


def test_weight_repacking_is_the_only_difference_from_the_cpu(servers, smollm2_path):
    path = str(smollm2_path)
    repacked = [a for a in GREEDY if a != "--no-cpu-repack"]
    cpu = _ok(_cli("run", "--json", "--raw", "-m", path, "-n", "12", "-c", "512", *repacked, "-ngl", "0", "-p", PROMPT,
                   python=os.environ.get("LOCALINFER_TEST_CPU_PYTHON") or None))  # fmt: skip
    rpc = _ok(_cli("run", "--json", "--raw", "-m", path, "-n", "12", "-c", "512", *repacked, "-ngl", "all", "-p", PROMPT, "--rpc", servers[0]))
    assert json.loads(rpc.stdout)["text"] == json.loads(cpu.stdout)["text"] == _cpu_text("smollm2", path)


def test_auto_plans_from_the_free_memory_of_a_device_too_small(servers, model):
    name, path = model
    # 1 GiB of headroom + 60 MiB: the repeating layers of both models fit, not all of their weights
    data = _run_json(path, "--rpc", servers[0], env={"LOCALINFER_FAKE_VRAM": str((1 << 30) + (60 << 20))})
    assert 0 < data["offload"]["gpu_layers"] < LAYERS[name]
    assert data["memory"]["estimate"]["gpu_bytes"] <= 60 << 20
    assert data["text"] == _cpu_text(name, path)


def test_all_layers_on_a_device_too_small_is_refused_with_figures(servers, smollm2_path):
    proc = _cli("run", "-m", str(smollm2_path), "-c", "512", "-n", "2", "-p", "hi", "--rpc", servers[0], "-ngl", "all",
                env={"LOCALINFER_FAKE_VRAM": "64MB"})  # fmt: skip
    assert proc.returncode == 6, proc.stderr.decode()
    error, hint = proc.stderr.decode().splitlines()[-2:]
    assert re.match(r"Error: not enough GPU memory for \S+ with 31 of 31 layers offloaded: it needs about [\d.]+ MB "
                    r"on the GPU \(.*\), and 64.0 MB is free", error), error  # fmt: skip
    assert re.search(r"fewer --gpu-layers \(about \d+ fit\)", hint)


def test_a_model_split_over_two_devices(servers, model):
    if len(servers) < 2:
        pytest.skip("needs two servers in LOCALINFER_TEST_RPC")
    name, path = model
    proc = _ok(_cli("run", "--json", "--verbose", "--raw", "-m", path, "-n", "12", "-c", "512", *GREEDY, "-p", PROMPT,
                    "--rpc", ",".join(servers[:2]), "-ngl", "all"))  # fmt: skip
    data, err = json.loads(proc.stdout), proc.stderr.decode()
    assert data["text"] == _cpu_text(name, path)
    assert len(_rpc_bytes(data)) == 2 and all(n > 0 for n in _rpc_bytes(data))  # each server holds part of the weights
    assert f"offloaded {LAYERS[name]}/{LAYERS[name]} layers to GPU" in err  # llama.cpp's log
    assert re.search(rf"^GPU layers +{LAYERS[name]} / {LAYERS[name]} offloaded \(--gpu-layers all\)$", err, re.MULTILINE)
    assert re.search(r"^load time +[\d.]+ m?s$", err, re.MULTILINE)
    weights = re.search(r"^weights on +(.*)$", err, re.MULTILINE).group(1)
    for endpoint in servers[:2]:  # the same split, in the verbose table
        assert re.search(rf"RPC0\[{re.escape(endpoint)}\] [\d.]+ MB", weights), weights


def test_chat_answers_as_on_the_cpu(servers, model):
    name, path = model
    args = ("chat", "-q", "-m", path, "-n", "10", *GREEDY)
    cpu = _cli(*args, "-ngl", "0", input=b"Name a color.\n", python=os.environ.get("LOCALINFER_TEST_CPU_PYTHON") or None)
    rpc = _cli(*args, "--rpc", servers[0], "-ngl", "all", input=b"Name a color.\n")
    if name == "gemma":  # a base model without a chat template: refused alike (exit 2)
        assert rpc.returncode == cpu.returncode == 2 and b"no chat template" in rpc.stderr
        return
    assert _ok(rpc).stdout == _ok(cpu).stdout and rpc.stdout.strip()


def test_batch_parallel_4_answers_as_on_the_cpu(servers, model, tmp_path):
    _, path = model
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"{p}\n" for p in ("Water boils at", "The moon is", "Cats like to", "Paris is the", "One plus one is")))
    args = ("batch", str(prompts), "-m", path, "--raw", "-n", "8", "--parallel", "4", "--keep-order", *GREEDY)

    def texts(proc: subprocess.CompletedProcess) -> list[str]:
        return [json.loads(line)["text"] for line in _ok(proc).stdout.decode().splitlines()]

    cpu = texts(_cli(*args, "-ngl", "0", python=os.environ.get("LOCALINFER_TEST_CPU_PYTHON") or None))
    assert texts(_cli(*args, "--rpc", servers[0], "-ngl", "all")) == cpu and len(cpu) == 5


def test_bench_on_the_cpu_and_the_device(servers, model):
    _, path = model
    proc = _ok(_cli("bench", "-m", path, "-ngl", "0,99", "-p", "32", "-n", "8", "-r", "2", "-t", "1", "-o", "json", "--no-log", "--rpc", servers[0]))
    rows = {(r["n_gpu_layers"], r["test"]): r for r in json.loads(proc.stdout)}
    assert set(rows) == {(0, "pp32"), (0, "tg8"), (99, "pp32"), (99, "tg8")}
    assert {r["backend"] for (ngl, _), r in rows.items() if ngl == 99} == {"RPC"}
    assert {r["backend"] for (ngl, _), r in rows.items() if ngl == 0} == {"CPU"}
    assert all(r["avg_ts"] > 0 for r in rows.values())
