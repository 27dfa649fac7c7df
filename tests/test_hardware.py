"""Machine facts: parsers, the simulated GPU/RAM knobs, nvidia-smi (a fake one on PATH), llama.cpp's devices."""

from __future__ import annotations

import os
import signal
import stat
import sys

import pytest

from localinfer.system import hardware
from localinfer.system.facts import llama_facts, store_disk
from localinfer.errors import UsageError

SMI_CSV = "NVIDIA GeForce RTX 4090, 24564, 23010, 550.54.14\nNVIDIA A100-SXM4-80GB, 81920, 81000, 550.54.14\n"


def test_parse_size():
    assert hardware.parse_size("8GB") == 8 * 1000**3
    assert hardware.parse_size("8 GiB") == 8 << 30
    assert hardware.parse_size("512MiB") == 512 << 20
    assert hardware.parse_size("1.5gb") == 1_500_000_000
    assert hardware.parse_size("123456") == 123456
    for bad in ("", "lots", "8 parsecs", "-1GB"):
        with pytest.raises(ValueError):
            hardware.parse_size(bad)


def test_parse_nvidia_smi():
    gpus = hardware.parse_nvidia_smi(SMI_CSV + "\n")
    assert [g.name for g in gpus] == ["NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-80GB"]
    assert gpus[0].memory_total_bytes == 24564 << 20 and gpus[0].memory_free_bytes == 23010 << 20
    assert gpus[0].driver == "550.54.14" and gpus[0].vendor == "nvidia" and gpus[0].source == "nvidia-smi"
    odd = hardware.parse_nvidia_smi("Weird GPU, [N/A], [N/A], 1.0\n")
    assert odd[0].memory_total_bytes is None


def test_parse_system_info_sections():
    info = "CPU : SSE3 = 1 | AVX2 = 1 | AMX_INT8 = 0 | OPENMP = 1 | CUDA : ARCHS = 890 | USE_GRAPHS = 1 | "
    sections = hardware.parse_system_info(info)
    assert sections["CPU"] == {"SSE3": "1", "AVX2": "1", "AMX_INT8": "0", "OPENMP": "1"}
    assert sections["CUDA"] == {"ARCHS": "890", "USE_GRAPHS": "1"}


def _fake_smi(tmp_path, monkeypatch, body: str):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + body)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.mark.skipif(os.name != "posix", reason="a shell-script nvidia-smi")
def test_gpus_from_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.delenv(hardware.FAKE_VRAM_ENV, raising=False)
    monkeypatch.setattr(hardware, "_nvml_gpus", lambda: None)  # as without pynvml
    _fake_smi(tmp_path, monkeypatch, f"printf '{SMI_CSV}'\n")
    found = hardware.gpus(ram_total=64 * 1000**3)
    assert [g.memory_total_bytes for g in found] == [24564 << 20, 81920 << 20]


@pytest.mark.skipif(os.name != "posix", reason="a shell-script nvidia-smi")
def test_a_hanging_nvidia_smi_is_given_up_on(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "_nvml_gpus", lambda: None)
    monkeypatch.setattr(hardware, "NVIDIA_SMI_TIMEOUT_S", 0.5)
    # It would write "finished" after 30 s; given up on, it is killed first (no bound on our time).
    done, pid = tmp_path / "finished", tmp_path / "sleep.pid"
    _fake_smi(tmp_path, monkeypatch, f"sleep 30 & echo $! > '{pid}'; wait $!; touch '{done}'\n")
    assert hardware._nvidia_smi_gpus(timeout=0.5) == []
    assert not done.exists()
    if pid.exists() and pid.read_text().strip():  # the orphaned sleep (if the script got that far)
        os.kill(int(pid.read_text()), signal.SIGTERM)


def test_fake_vram_replaces_the_gpus(monkeypatch):
    monkeypatch.setenv(hardware.FAKE_VRAM_ENV, "8GB")
    (gpu,) = hardware.gpus()
    assert gpu.memory_free_bytes == gpu.memory_total_bytes == 8 * 1000**3 and gpu.source == hardware.FAKE_VRAM_ENV
    monkeypatch.setenv(hardware.FAKE_VRAM_ENV, "plenty")
    with pytest.raises(UsageError, match=hardware.FAKE_VRAM_ENV):
        hardware.gpus()


@pytest.mark.llama
def test_memory_budget_reads_the_machine_or_the_simulation(monkeypatch):
    real = hardware.memory_budget()
    assert 0 < real.ram_available and 0 < real.ram_total
    monkeypatch.setenv(hardware.FAKE_RAM_ENV, "300MB")
    monkeypatch.setenv(hardware.FAKE_VRAM_ENV, "8GB")
    fake = hardware.memory_budget()
    assert fake.ram_available == 300 * 1000**2 and "simulated" in fake.notes[-1]
    # on a CPU-only build a simulated GPU changes nothing: no offload, no VRAM
    if not fake.gpu_offload:
        assert fake.vram_free is None


def test_memory_and_cpu_facts():
    mem = hardware.memory()
    assert mem["total_bytes"] >= mem["available_bytes"] > 0
    physical, logical = hardware.cpu_cores()
    assert logical >= 1 and (physical is None or physical <= logical)
    assert hardware.cpu_model()


@pytest.mark.llama
def test_llama_cpp_facts_and_devices():
    facts = llama_facts()
    assert facts["version"] and "CPU" in facts["backends"]
    assert isinstance(facts["gpu_offload"], bool)
    cpu = [d for d in facts["devices"] if d["type"] == "cpu"]
    assert cpu and cpu[0]["total_bytes"] > 0
    assert facts["simd"] and not set(facts["simd"]) & {"OPENMP", "LLAMAFILE", "REPACK"}
    assert facts["amx"] == ("AMX_INT8 = 1" in facts["system_info"])
    if facts["amx"]:
        assert facts["cpu_repack"] is (os.environ.get("LOCALINFER_CPU_REPACK", "") in ("1", "true", "yes", "on"))


def test_store_disk_points_at_the_model_store(isolated_home):
    store = store_disk()
    assert store["path"] == str(isolated_home / "models") and store["free_bytes"] > 0


def test_proc_meminfo_matches_psutil():
    import sys

    import psutil
    import pytest

    from localinfer.system.hardware import _proc_meminfo

    if not sys.platform.startswith("linux"):
        pytest.skip("/proc/meminfo is Linux's")
    total, available, swap_free = _proc_meminfo()
    assert total == psutil.virtual_memory().total
    assert abs(available - psutil.virtual_memory().available) < 256 * 2**20  # read a moment apart
    assert abs(swap_free - psutil.swap_memory().free) < 256 * 2**20


@pytest.mark.llama
def test_default_threads_are_the_physical_cores_psutil_counts():
    # Read from sysfs on Linux (psutil's own first method there), without importing psutil.
    import psutil

    from localinfer.engine import backend

    assert backend.default_threads() == (psutil.cpu_count(logical=False) or os.cpu_count())
    if sys.platform.startswith("linux"):
        assert backend._sysfs_physical_cores() == psutil.cpu_count(logical=False)
        from conftest import run_python

        code = "import sys\nfrom localinfer.engine import backend\nbackend.default_threads()\nprint('psutil' in sys.modules)\n"
        assert run_python(code, timeout=60).stdout.strip() == "False"
