"""`localinfer doctor`: the report's fields (real entry point and CliRunner) and its advice."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from typer.testing import CliRunner

from localinfer.cli.main import build_app
from localinfer.system.advice import advice, comfortable_model, reinstall_command


def _doctor_json(env: dict | None = None) -> dict:
    proc = run_cli("doctor", "--json", env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout)


@pytest.mark.llama
def test_doctor_json_has_the_machine_facts(isolated_home):
    data = _doctor_json({"LOCALINFER_FAKE_VRAM": ""})
    assert data["os"]["system"] and data["os"]["machine"]
    assert data["cpu"]["model"] and data["cpu"]["logical_cores"] >= 1
    assert data["memory"]["total_bytes"] >= data["memory"]["available_bytes"] > 0
    llama = data["llama_cpp"]
    assert llama["version"] == data["versions"]["llama_cpp_python"] and "CPU" in llama["backends"]
    assert isinstance(llama["gpu_offload"], bool) and llama["simd"]
    assert isinstance(llama["amx"], bool) and isinstance(llama["cpu_repack"], bool)
    assert data["store"]["path"] == str(isolated_home / "models") and data["store"]["free_bytes"] > 0
    assert data["store"]["problem"] is None
    assert data["versions"]["localinfer"] and data["versions"]["python"]
    fit = data["comfortable_model"]
    assert 0 < fit["max_file_bytes"] < data["memory"]["total_bytes"]
    kinds = [a["kind"] for a in data["advice"]]
    assert "model_size" in kinds
    assert ("amx_repack" in kinds) == llama["amx"]
    if not llama["gpu_offload"] and not data["gpus"]:
        assert "gpu_unused" not in kinds


@pytest.mark.llama
def test_doctor_advises_a_cuda_rebuild_when_a_gpu_sits_unused():
    data = _doctor_json({"LOCALINFER_FAKE_VRAM": "8GB"})
    (gpu,) = data["gpus"]
    assert gpu["memory_total_bytes"] == 8 * 1000**3 and gpu["source"] == "LOCALINFER_FAKE_VRAM"
    if data["llama_cpp"]["gpu_offload"]:  # a GPU build: nothing to rebuild
        return
    (item,) = [a for a in data["advice"] if a["kind"] == "gpu_unused"]
    assert item["command"].startswith('CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall')
    assert f"llama-cpp-python=={data['versions']['llama_cpp_python']}" in item["command"]
    assert data["comfortable_model"]["gpu_max_file_bytes_after_rebuild"] > 0


@pytest.mark.llama
def test_doctor_text_report_through_cli_runner(monkeypatch):
    monkeypatch.setenv("LOCALINFER_FAKE_VRAM", "8GB")
    res = CliRunner().invoke(build_app(), ["doctor"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    for label in ("OS", "CPU", "RAM", "GPU", "model store", "llama.cpp", "GPU offload", "SIMD", "versions", "Advice:"):
        assert f"\n{label}" in "\n" + out, label
    assert "Simulated NVIDIA GPU" in out and "8.0 GB" in out
    assert "largest model that runs comfortably" in out


@pytest.mark.llama
def test_doctor_rejects_a_bad_simulated_size():
    proc = run_cli("doctor", env={"LOCALINFER_FAKE_VRAM": "lots"}, timeout=120)
    assert proc.returncode == 2 and b"LOCALINFER_FAKE_VRAM" in proc.stderr and proc.stdout == b""


@pytest.mark.llama
def test_doctor_reports_a_store_under_a_file_instead_of_its_free_space(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    data = _doctor_json({"LOCALINFER_HOME": str(blocker / "home"), "LOCALINFER_FAKE_VRAM": ""})
    store = data["store"]
    assert store["problem"] == f"{blocker} is a file, not a folder" and store["free_bytes"] is None
    first = data["advice"][0]
    assert first["kind"] == "store_unusable" and "set LOCALINFER_HOME to a folder you can write" in first["message"]


@pytest.mark.llama
def test_doctor_reports_a_read_only_store(read_only_dir, monkeypatch):
    monkeypatch.setenv("LOCALINFER_HOME", str(read_only_dir))
    res = CliRunner().invoke(build_app(), ["doctor"])
    assert res.exit_code == 0, res.output
    assert f"the model store {read_only_dir / 'models'} cannot be used: {read_only_dir} is not writable" in res.stdout


def _facts(**over) -> dict:
    base = {
        "llama_cpp": {"gpu_offload": False, "devices": [], "backends": ["CPU"], "amx": False, "cpu_repack": True},
        "memory": {"total_bytes": 16 * 1000**3, "cgroup_room_bytes": None},
        "gpus": [],
        "store": {"path": "/m", "free_bytes": 100 * 1000**3},
        "versions": {"llama_cpp_python": "0.3.36"},
    }
    base.update(over)
    return base


def test_advice_for_apple_silicon_is_a_metal_rebuild():
    gpu = {"name": "Apple Silicon GPU (unified memory)", "vendor": "apple", "memory_total_bytes": 10 * 1000**3}
    (item,) = [a for a in advice(_facts(gpus=[gpu])) if a["kind"] == "gpu_unused"]
    assert item["command"] == reinstall_command("apple", "0.3.36")
    assert 'CMAKE_ARGS="-DGGML_METAL=on"' in item["command"]


def test_advice_on_a_gpu_build_sizes_models_by_vram():
    dev = {"type": "gpu", "total_bytes": 24 << 30, "free_bytes": 23 << 30}
    facts = _facts(llama_cpp={"gpu_offload": True, "devices": [dev], "backends": ["CUDA", "CPU"], "amx": False})
    fit = comfortable_model(facts)
    assert fit["where"] == "GPU memory" and fit["max_file_bytes"] == int((23 << 30) / 1.2)
    assert all(a["kind"] != "gpu_unused" for a in advice(facts))


def test_advice_when_a_gpu_build_sees_no_gpu_and_disk_is_low():
    facts = _facts(
        llama_cpp={"gpu_offload": True, "devices": [], "backends": ["CUDA", "CPU"], "amx": False},
        store={"path": "/m", "free_bytes": 2 * 1000**3},
    )
    kinds = {a["kind"]: a for a in advice(facts)}
    assert "CUDA" in kinds["gpu_not_visible"]["message"] and "2.0 GB" in kinds["low_disk"]["message"]


def test_advice_when_llama_cpp_is_broken():
    (item,) = advice(_facts(llama_cpp={"error": "OSError: libggml.so: cannot open"}))
    assert item["kind"] == "llama_cpp_broken" and "0.3.36" in item["command"]


def test_advice_puts_an_unusable_store_first():
    facts = _facts(store={"path": "/m", "free_bytes": None, "problem": "/m is not writable"})
    first, *rest = advice(facts)
    assert first["kind"] == "store_unusable" and "/m is not writable" in first["message"]
    assert all(a["kind"] != "low_disk" for a in rest)


@pytest.mark.llama
def test_doctor_on_a_60_column_terminal_wraps_at_word_boundaries(isolated_home):
    # The terminal wrapped each long line wherever column 60 fell, mid-word (issue 31).
    import os
    import re
    import sys

    import pexpect

    env = {**os.environ, "TERM": "xterm", "COLUMNS": "60", "LINES": "60", "LOCALINFER_FAKE_VRAM": "8GB"}
    child = pexpect.spawn(sys.executable, ["-m", "localinfer", "doctor"], env=env, encoding="utf-8", dimensions=(60, 60))
    child.expect(pexpect.EOF, timeout=120)
    shown = child.before.replace("\r", "")
    piped = run_cli("doctor", env={"LOCALINFER_FAKE_VRAM": "8GB"}, timeout=120).stdout.decode()
    assert all(len(line) <= 60 or " " not in line.strip() for line in shown.splitlines()), shown
    assert max(map(len, piped.splitlines())) > 60  # a pipe keeps one line per fact
    # The same words, none split: only the line breaks (and a command's "\" continuations) differ.
    def words(text: str) -> list[str]:  # free memory and disk change between the two runs
        return re.sub(r"\d+(\.\d+)?\s+(GB|MB|kB|B)\b", "N", text).split()

    assert words(shown.replace(" \\\n", " ")) == words(piped)
    command = re.search(r"^ {6}(CMAKE_ARGS=.*?)(?=^\S|^  - )", shown, re.M | re.S)
    if command:  # wrapped with continuations: still one command for the shell
        assert all(line.endswith(" \\") for line in command.group(1).rstrip("\n").split("\n")[:-1])


def test_a_model_that_fits_in_ram_is_comfortable_only_if_the_cores_decode_it_fast_enough():
    # 32 GB on 2 cores was "~26B parameters ... comfortably": about 0.2 tokens a second (issue 31).
    from localinfer.system.advice import COMFORTABLE_TPS, CPU_BYTES_PER_S_PER_CORE

    two = _facts(memory={"total_bytes": 32 * 1000**3, "cgroup_room_bytes": None}, cpu={"physical_cores": 2, "logical_cores": 2})
    fit = comfortable_model(two)
    assert fit["where"] == "RAM" and fit["limited_by"] == "cores" and fit["cores"] == 2
    assert fit["max_file_bytes"] == int(2 * CPU_BYTES_PER_S_PER_CORE / COMFORTABLE_TPS) == 1_000_000_000
    (item,) = [a for a in advice(two) if a["kind"] == "model_size"]
    assert "(~1.7B parameters at Q4_K_M)" in item["message"] and "5+ tokens/s on 2 cores" in item["message"]

    many = _facts(memory={"total_bytes": 32 * 1000**3, "cgroup_room_bytes": None}, cpu={"physical_cores": 64, "logical_cores": 128})
    fit = comfortable_model(many)  # 64 cores keep up with all that fits in RAM
    assert fit["limited_by"] == "memory" and fit["max_file_bytes"] == int((32 * 1000**3 - 8 * 1000**3) / 1.2)
    (item,) = [a for a in advice(many) if a["kind"] == "model_size"]
    assert "(~33B parameters at Q4_K_M)" in item["message"] and "memory bandwidth" in item["message"]

    gpu = {"type": "gpu", "total_bytes": 24 << 30, "free_bytes": 23 << 30}
    on_gpu = _facts(llama_cpp={"gpu_offload": True, "devices": [gpu], "backends": ["CUDA", "CPU"], "amx": False},
                    cpu={"physical_cores": 2, "logical_cores": 2})  # fmt: skip
    assert comfortable_model(on_gpu)["limited_by"] == "memory"  # the GPU decodes, not the 2 cores
