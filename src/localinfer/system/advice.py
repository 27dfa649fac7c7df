"""`doctor`'s findings: the machine's facts (localinfer.system.hardware) and what to do about them.

Advice is concrete: the exact reinstall command when a GPU is present but llama-cpp-python was built
for the CPU only, the largest model this machine runs comfortably, why weight repacking is off on
AMX CPUs, low disk in the model store, or a store that cannot be used at all.
"""

from __future__ import annotations

from typing import Any
from localinfer.units import human_bytes as _human

GiB = 1 << 30
Q4_K_M_BYTES_PER_PARAM = 0.6  # ~4.85 bits per weight
OVERHEAD = 1.2  # KV cache (4096 tokens) and compute buffers on top of the file, for typical models
LOW_DISK = 10 * 1000**3
# On the CPU, decode reads every weight once per token, and a core gets through about 2.5 GB of
# Q4 weights a second (SmolLM2's 98 MB at 50 tok/s on 2 cores: benchmarks/results/
# bench-vs-llama-bench-2026-11-29.txt). "Comfortable" is at least 5 tokens a second.
CPU_BYTES_PER_S_PER_CORE = 2.5e9
COMFORTABLE_TPS = 5

_REINSTALL = 'CMAKE_ARGS="{flags}" pip install --force-reinstall --no-cache-dir llama-cpp-python=={version}'
_BUILD_FLAGS = {"nvidia": "-DGGML_CUDA=on", "apple": "-DGGML_METAL=on"}


# Builds ggml's AVX-512 kernels (its weight repacking included) without the AMX tile kernels that
# GCC 12 miscompiles; after it, LOCALINFER_CPU_REPACK=1 is safe.
AMX_REBUILD_COMMAND = (
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON '
    '-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON" '
    "pip install --force-reinstall --no-cache-dir --no-deps llama-cpp-python==0.3.36"
)

def reinstall_command(vendor: str, version: str | None, *, rpc: bool = False) -> str | None:
    """The pip command that rebuilds llama-cpp-python for this GPU vendor (None: we know of none);
    ``rpc``: keep the RPC backend the current build has."""
    flags = _BUILD_FLAGS.get(vendor)
    if flags is None:
        return None
    return _REINSTALL.format(flags=flags + (" -DGGML_RPC=ON" if rpc else ""), version=version or "0.3.36")


def local_offload(llama: dict[str, Any]) -> bool:
    """Whether the build drives a GPU of this machine: llama.cpp says it can offload for a build
    whose only such backend is RPC (remote ggml-rpc-servers), which does not."""
    backends = llama.get("backends", [])
    gpu_backends = [b for b in backends if b not in ("CPU", "BLAS", "RPC")]
    return bool(llama.get("gpu_offload")) and (bool(gpu_backends) or "RPC" not in backends)


def comfortable_model(report: dict[str, Any]) -> dict[str, Any]:
    """The largest GGUF file this machine runs comfortably (all in GPU memory when the build can
    offload, else in RAM with room left for the OS), and what that means in parameters at Q4_K_M."""
    llama = report.get("llama_cpp", {})
    mem = report.get("memory", {})
    ram_total = int(mem.get("total_bytes") or 0)
    gpu_devices = [d for d in llama.get("devices", []) if d.get("type") in ("gpu", "igpu")]
    if llama.get("gpu_offload") and gpu_devices:
        budget = sum(int(d.get("total_bytes") or 0) for d in gpu_devices) - GiB * len(gpu_devices)
        remote = all(d.get("backend") == "RPC" for d in gpu_devices)
        where = "the RPC servers' memory" if remote else "GPU memory"
    else:
        room = mem.get("cgroup_room_bytes")
        total = min(ram_total, room) if room else ram_total
        budget = total - max(2 * 1000**3, total // 4)  # leave the OS and other programs their share
        where = "RAM"
    size = max(0, int(budget / OVERHEAD))
    limited_by = "memory"
    cpu = report.get("cpu") or {}
    cores = cpu.get("physical_cores") or cpu.get("logical_cores")
    if where == "RAM" and cores:  # what fits in RAM may still answer at a word every few seconds
        by_speed = int(cores * CPU_BYTES_PER_S_PER_CORE / COMFORTABLE_TPS)
        if by_speed < size:
            size, limited_by = by_speed, "cores"
    out: dict[str, Any] = {
        "max_file_bytes": size,
        "max_params_q4_k_m": int(size / Q4_K_M_BYTES_PER_PARAM),
        "where": where,
        "limited_by": limited_by,
        "cores": cores if where == "RAM" else None,
        "context": 4096,
        "gpu_max_file_bytes_after_rebuild": None,
    }
    unused = [g for g in report.get("gpus", []) if g.get("memory_total_bytes") and not local_offload(llama)]
    if unused:
        vram = sum(int(g["memory_total_bytes"]) - GiB for g in unused)
        out["gpu_max_file_bytes_after_rebuild"] = max(0, int(vram / OVERHEAD))
    return out


def _gpu_advice(gpus: list[dict[str, Any]], llama: dict[str, Any], version: str | None) -> list[dict[str, Any]]:
    """A GPU the build cannot use (with the rebuild command), an RPC-only build without servers, or
    a GPU build that sees no GPU: at most one of them."""
    devices = [d for d in llama.get("devices", []) if d.get("type") in ("gpu", "igpu")]
    rpc_build = "RPC" in llama.get("backends", [])
    if gpus and not local_offload(llama):
        gpu = gpus[0]
        item: dict[str, Any] = {
            "kind": "gpu_unused",
            "message": f"{gpu['name']} is present, but this llama-cpp-python was built without a backend for it "
            "(CPU only" + (", or remote RPC servers" if rpc_build else "") + "), so models run on the CPU; rebuild it with GPU support",
        }
        cmd = reinstall_command(gpu.get("vendor", ""), version, rpc=rpc_build)
        return [{**item, "command": cmd}] if cmd else [item]
    if rpc_build and not local_offload(llama) and not devices:
        return [{
            "kind": "rpc_only",
            "message": "this llama-cpp-python offloads only to ggml-rpc-servers (it was built with -DGGML_RPC=ON "
            "and no GPU backend): pass --rpc HOST:PORT to use one (see docs/hardware.md)",
        }]
    if local_offload(llama) and not [d for d in devices if d.get("backend") != "RPC"]:
        built = ", ".join(b for b in llama.get("backends", []) if b not in ("CPU", "BLAS", "RPC"))
        return [{
            "kind": "gpu_not_visible",
            "message": f"llama-cpp-python was built with {built} but llama.cpp sees no GPU: check the driver "
            "(nvidia-smi) and that the GPU is visible to this process",
        }]
    return []


def advice(report: dict[str, Any]) -> list[dict[str, Any]]:
    """What to do, most important first: [{"kind", "message", "command"?}]."""
    out: list[dict[str, Any]] = []
    store = report.get("store", {})
    if store.get("problem"):  # first: no command that keeps files can work
        out.append({
            "kind": "store_unusable",
            "message": f"the model store {store.get('path')} cannot be used: {store['problem']}; "
            "set LOCALINFER_HOME to a folder you can write",
        })
    llama = report.get("llama_cpp", {})
    version = report.get("versions", {}).get("llama_cpp_python")
    if "error" in llama:
        out.append({
            "kind": "llama_cpp_broken",
            "message": f"llama-cpp-python does not load: {llama['error']}",
            "command": f"pip install --force-reinstall --no-cache-dir llama-cpp-python=={version or '0.3.36'}",
        })
        return out
    out.extend(_gpu_advice(report.get("gpus", []), llama, version))
    if llama.get("amx"):
        state = "on (LOCALINFER_CPU_REPACK)" if llama.get("cpu_repack") else "off (as llama-server's --no-repack)"
        out.append({
            "kind": "amx_repack",
            "message": f"this CPU has AMX; llama.cpp's AMX kernels crash on batches when built with GCC 12 "
            f"(ggml-org/llama.cpp#20824, PR #26954), so weight repacking is {state}; "
            "--cpu-repack or LOCALINFER_CPU_REPACK=1 turns it on",
            "command": AMX_REBUILD_COMMAND,
        })
    fit = comfortable_model(report)
    params = fit["max_params_q4_k_m"] / 1e9
    billions = f"{params:.1f}".removesuffix(".0") if params < 10 else f"{params:.0f}"
    out.append({
        "kind": "model_size",
        "message": f"largest model that runs comfortably here: about {_human(fit['max_file_bytes'])} of GGUF "
        f"(~{billions}B parameters at Q4_K_M) with a {fit['context']}-token context, in {fit['where']}"
        + (f", at {COMFORTABLE_TPS}+ tokens/s on {fit['cores']} cores (decode reads every weight once per token, "
           f"about {CPU_BYTES_PER_S_PER_CORE / 1e9:g} GB/s a core); larger ones fit in RAM but answer slower"
           if fit["limited_by"] == "cores" else "")
        + ("; on the CPU, decode speed is about memory bandwidth / file size, so smaller models answer faster"
           if fit["where"] == "RAM" and fit["limited_by"] != "cores" else "")
        + (f"; with a GPU build, up to about {_human(fit['gpu_max_file_bytes_after_rebuild'])} would run on the GPU"
           if fit["gpu_max_file_bytes_after_rebuild"] else ""),
    })
    free = store.get("free_bytes")
    if free is not None and free < LOW_DISK:
        out.append({"kind": "low_disk", "message": f"only {_human(free)} free for models in {store.get('path')}"})
    room = report.get("memory", {}).get("cgroup_room_bytes")
    if room is not None:
        out.append({"kind": "container_limit", "message": f"a container memory limit leaves {_human(room)} to this process"})
    return out


def report() -> dict[str, Any]:
    """Facts and advice, JSON-able: what `localinfer doctor --json` prints."""
    from localinfer import paths
    from localinfer.system.facts import collect

    with paths.unchecked():  # an unusable data dir is a finding here, not a failure
        facts = collect()
    problem = paths.data_dir_problem()
    facts["store"]["problem"] = problem
    if problem:  # the free space of whatever is in the way says nothing about the store
        facts["store"]["free_bytes"] = None
    facts["comfortable_model"] = comfortable_model(facts)
    facts["advice"] = advice(facts)
    return facts
