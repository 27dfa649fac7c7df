"""Everything `localinfer doctor` reports about this machine, as plain JSON-able values: the facts of
``hardware.py`` (CPU, memory, GPUs), what the installed llama.cpp was built with, the store's disk and
the versions of what we run on. The pre-flight never calls this (``hardware.memory_budget`` is its)."""

from __future__ import annotations

import platform
import shutil
from dataclasses import asdict

from localinfer.system import hardware

_BUILD_FEATURES = frozenset({"LLAMAFILE", "OPENMP", "REPACK", "KLEIDIAI", "ACCELERATE", "BLAS", "AARCH64_REPACK"})


def llama_facts() -> dict:
    """What the installed llama-cpp-python was built with; {"error": ...} if it does not import."""
    try:
        from localinfer.engine import backend as engine
    except Exception as exc:  # a broken install is exactly what doctor must report
        return {"error": f"{type(exc).__name__}: {exc}"}
    info = engine.system_info()
    sections = hardware.parse_system_info(info)
    cpu = sections.get("CPU", {})
    amx = engine.cpu_has_amx()
    return {
        "version": _dist_version("llama-cpp-python"),
        "system_info": info.strip(),
        "backends": engine.backends(),
        "gpu_offload": engine.supports_gpu_offload(),
        "devices": engine.devices(),
        "simd": sorted(k for k, v in cpu.items() if v == "1" and k not in _BUILD_FEATURES),
        "build_features": sorted(k for k, v in cpu.items() if v == "1" and k in _BUILD_FEATURES),
        "amx": amx,
        "cpu_repack": engine.cpu_repack_enabled(None),
        "mmap": bool(engine.llama_cpp.llama_supports_mmap()),
        "mlock": bool(engine.llama_cpp.llama_supports_mlock()),
    }


def store_disk() -> dict:
    """The model store's path and the free disk where it lives (its nearest existing parent)."""
    from localinfer.paths import models_dir

    path = models_dir()
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        free = None
    return {"path": str(path), "free_bytes": free}


def _dist_version(dist: str) -> str | None:
    """An installed distribution's version, read from its metadata (the package is not imported)."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    from localinfer import __version__

    return {
        "localinfer": __version__,
        "python": platform.python_version(),
        "llama_cpp_python": _dist_version("llama-cpp-python"),
        "typer": _dist_version("typer"),
        "huggingface_hub": _dist_version("huggingface-hub"),
    }


def collect() -> dict:
    """Every fact doctor reports, as plain JSON-able values."""
    physical, logical = hardware.cpu_cores()
    mem = hardware.memory()
    return {
        "os": {"system": platform.system(), "release": platform.release(), "machine": platform.machine(),
               "platform": platform.platform()},
        "cpu": {"model": hardware.cpu_model(), "physical_cores": physical, "logical_cores": logical},
        "memory": mem,
        "llama_cpp": llama_facts(),
        "gpus": [asdict(g) for g in hardware.gpus(int(mem["total_bytes"] or 0))],
        "store": store_disk(),
        "versions": versions(),
    }
