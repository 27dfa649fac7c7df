"""What the RPC backend cannot show, against fake device lists at the engine.backend boundary: CUDA
and Metal device names, Apple's unified memory, several GPUs of different sizes, and the rebuild
advice when a GPU is present but the build is CPU-only (or offloads only to RPC servers)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest

from localinfer.cli.doctor import render
from localinfer.engine import backend
from localinfer.engine.types import LoadOptions
from localinfer.system import hardware
from localinfer.system.advice import report
from localinfer.system.estimate import GPU_LAYERS_AUTO
from localinfer.system.preflight import plan_load

GiB, MiB = 1 << 30, 1 << 20
CPU = {"name": "CPU", "description": "AMD EPYC", "type": "cpu", "free_bytes": 30 * GiB, "total_bytes": 32 * GiB, "backend": "CPU"}
RTX = hardware.GPU("NVIDIA GeForce RTX 4090", "nvidia", 24 * GiB, 23 * GiB, "550.54", "nvml")


def _dev(name: str, description: str, free: int, total: int, backend_name: str, kind: str = "gpu") -> dict:
    return {"name": name, "description": description, "type": kind, "free_bytes": free, "total_bytes": total, "backend": backend_name}


@pytest.fixture
def fake(monkeypatch) -> Callable[..., None]:
    """Make llama.cpp's device list, backends and offload support what the test says; the GPUs
    outside llama.cpp (NVML, nvidia-smi, sysctl) too."""
    for env in (hardware.FAKE_VRAM_ENV, hardware.FAKE_RAM_ENV, "LOCALINFER_RPC"):
        monkeypatch.delenv(env, raising=False)

    def set_(devices: list[dict], backends: list[str], *, gpus: list[hardware.GPU] = (), offload: bool | None = None) -> None:
        info = " | ".join(f"{b} : ARCHS = 890" for b in backends if b not in ("CPU", "RPC")) + " | CPU : AVX2 = 1 | "
        monkeypatch.setattr(backend, "devices", lambda: [dict(d) for d in devices])
        monkeypatch.setattr(backend, "backends", lambda: list(backends))
        has_gpu = any(b not in ("CPU", "BLAS") for b in backends)
        monkeypatch.setattr(backend, "supports_gpu_offload", lambda: has_gpu if offload is None else offload)
        monkeypatch.setattr(backend, "system_info", lambda: info)
        monkeypatch.setattr(hardware, "gpus", lambda ram_total=None: list(gpus))

    return set_


@pytest.fixture(scope="module")
def smollm2_info(smollm2_path):
    from localinfer.gguf import read_gguf

    return read_gguf(smollm2_path)  # 30 layers + output: 31 offloadable


def _kinds(data: dict) -> dict[str, dict]:
    return {a["kind"]: a for a in data["advice"]}


def test_a_cuda_device_is_listed_planned_for_and_named(fake, smollm2_info):
    fake([_dev("CUDA0", "NVIDIA GeForce RTX 4090", 23 * GiB, 24 * GiB, "CUDA"), CPU], ["CUDA", "CPU"], gpus=[RTX])
    data = report()
    assert "CUDA0 (gpu): NVIDIA GeForce RTX 4090 · 25.8 GB (24.7 GB free)" in render(data)
    assert not {"gpu_unused", "gpu_not_visible", "rpc_only"} & set(_kinds(data))
    assert data["comfortable_model"]["where"] == "GPU memory"
    budget = hardware.memory_budget()
    assert (budget.gpu_offload, budget.vram_free, budget.unified, budget.gpu_devices) == (True, 23 * GiB, False, 1)
    assert plan_load(smollm2_info, LoadOptions(n_gpu_layers=GPU_LAYERS_AUTO)).n_gpu_layers == 31
    from localinfer.bench.facts import backend_name

    assert backend_name(99) == "CUDA" and backend_name(0) == "CPU"


def test_a_cuda_build_that_sees_no_gpu_says_check_the_driver(fake):
    fake([CPU], ["CUDA", "CPU"])
    item = _kinds(report())["gpu_not_visible"]
    assert "built with CUDA" in item["message"] and "nvidia-smi" in item["message"]
    from localinfer.bench.facts import backend_name

    assert backend_name(99) == "CPU"  # nothing to offload to: bench's backend column says where it ran


def test_bench_names_the_backends_the_layers_go_to_rpc_last_as_llama_bench(fake):
    from localinfer.bench.facts import backend_name

    fake([CPU], ["CPU", "RPC"])  # an RPC build without servers
    assert backend_name(99) == "CPU"
    fake([_dev("RPC0", "127.0.0.1:50052", GiB, GiB, "RPC"), _dev("CUDA0", "NVIDIA T4", GiB, 16 * GiB, "CUDA"), CPU],
         ["CUDA", "CPU", "RPC"])  # fmt: skip
    assert backend_name(99) == "CUDA,RPC" and backend_name(0) == "CPU"
    fake([_dev("Metal", "Apple M2", 8 * GiB, 16 * GiB, "Metal", kind="igpu"), CPU], ["Metal", "CPU"])
    assert backend_name(-1) == "Metal"


def test_several_gpus_of_different_sizes_are_summed_each_with_its_headroom(fake, smollm2_info):
    big, small = _dev("CUDA0", "NVIDIA A100", 1 * GiB + 60 * MiB, 40 * GiB, "CUDA"), _dev("CUDA1", "NVIDIA T4", 1 * GiB + 20 * MiB, 16 * GiB, "CUDA")
    fake([big, small, CPU], ["CUDA", "CPU"], gpus=[RTX, RTX])
    text = render(report())
    assert "CUDA0 (gpu): NVIDIA A100 · 42.9 GB" in text and "CUDA1 (gpu): NVIDIA T4 · 17.2 GB" in text
    budget = hardware.memory_budget()
    assert (budget.vram_free, budget.gpu_devices) == (2 * GiB + 80 * MiB, 2)
    # 80 MiB left after 1 GiB on each device: part of the 98 MB of weights, not all of it
    layers = plan_load(smollm2_info, LoadOptions(n_gpu_layers=GPU_LAYERS_AUTO)).n_gpu_layers
    assert 0 < layers < 31
    one_device = hardware.MemoryBudget(budget.ram_available, budget.ram_total, gpu_offload=True, vram_free=budget.vram_free)
    assert plan_load(smollm2_info, LoadOptions(n_gpu_layers=GPU_LAYERS_AUTO), budget=one_device).n_gpu_layers == 31


def test_metal_on_apple_shares_the_ram(fake, smollm2_info, monkeypatch):
    fake([_dev("MTL0", "Apple M3 Max", 27 * GiB, 27 * GiB, "Metal"), CPU], ["Metal", "BLAS", "CPU"])
    monkeypatch.setattr(sys, "platform", "darwin")
    assert "MTL0 (gpu): Apple M3 Max" in render(report())
    monkeypatch.setenv(hardware.FAKE_RAM_ENV, "300MB")
    budget = hardware.memory_budget()
    assert budget.unified and budget.gpu_offload
    plan = plan_load(smollm2_info, LoadOptions(n_gpu_layers=GPU_LAYERS_AUTO))
    # every layer on the GPU, and the GPU's buffers taken from the RAM: the default context shrinks
    assert plan.n_gpu_layers == 31 and plan.ctx_source == "default, reduced to fit memory"
    separate = hardware.MemoryBudget(budget.ram_available, budget.ram_total, gpu_offload=True, vram_free=27 * GiB)
    assert plan_load(smollm2_info, LoadOptions(n_gpu_layers=GPU_LAYERS_AUTO), budget=separate).ctx_source == "default"


def test_a_remote_device_is_never_unified_memory(fake, monkeypatch):
    fake([_dev("RPC0", "10.0.0.2:50052", 20 * GiB, 24 * GiB, "RPC"), CPU], ["RPC", "CPU"])
    monkeypatch.setattr(sys, "platform", "darwin")
    budget = hardware.memory_budget()
    assert (budget.vram_free, budget.unified) == (20 * GiB, False)


@pytest.mark.parametrize(
    ("gpu", "flags"),
    [(RTX, "-DGGML_CUDA=on"), (hardware.GPU("Apple Silicon GPU (unified memory)", "apple", 24 * GiB, None, None, "sysctl", True), "-DGGML_METAL=on")],
)
def test_a_gpu_with_a_cpu_only_build_gets_the_cmake_args(fake, gpu, flags):
    fake([CPU], ["CPU"], gpus=[gpu])
    data = report()
    item = _kinds(data)["gpu_unused"]
    assert item["command"] == f'CMAKE_ARGS="{flags}" pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36'
    assert gpu.name in item["message"] and item["command"] in render(data)
    assert data["comfortable_model"]["gpu_max_file_bytes_after_rebuild"] > 0


def test_an_rpc_only_build_is_no_gpu_build(fake):
    fake([CPU], ["CPU", "RPC"], gpus=[RTX], offload=True)  # llama.cpp says it can offload: to RPC servers
    kinds = _kinds(report())
    assert kinds["gpu_unused"]["command"].startswith('CMAKE_ARGS="-DGGML_CUDA=on -DGGML_RPC=ON" pip install')
    fake([CPU], ["CPU", "RPC"], offload=True)
    data = report()
    assert "pass --rpc HOST:PORT" in _kinds(data)["rpc_only"]["message"]
    assert "nvidia-smi" not in render(data) and "gpu_not_visible" not in _kinds(data)


def test_an_rpc_only_build_with_servers_lists_them(fake):
    fake([CPU, _dev("RPC0", "10.0.0.2:50052", 20 * GiB, 24 * GiB, "RPC"), _dev("RPC1", "10.0.0.3:50052", 6 * GiB, 8 * GiB, "RPC")],
         ["CPU", "RPC"], offload=True)  # fmt: skip
    data = report()
    text = render(data)
    assert "RPC0 (RPC): 10.0.0.2:50052 · 25.8 GB (21.5 GB free)" in text and "RPC1 (RPC): 10.0.0.3:50052" in text
    assert not {"gpu_unused", "gpu_not_visible", "rpc_only"} & set(_kinds(data))
    assert data["comfortable_model"]["where"] == "the RPC servers' memory"
    assert hardware.memory_budget().gpu_devices == 2
