"""Facts about this machine: CPU, memory, GPUs, and the memory budget a load may use now.

``doctor`` shows all of it (``facts.py`` adds llama.cpp's build, the disk, the versions); the pre-flight
only asks :func:`memory_budget` (cheap: no subprocess).
Two environment variables simulate hardware for tests and for planning on another machine:
``LOCALINFER_FAKE_VRAM`` (e.g. ``8GB``: one simulated GPU with that much free memory) and
``LOCALINFER_FAKE_RAM`` (available RAM).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

FAKE_VRAM_ENV = "LOCALINFER_FAKE_VRAM"
FAKE_RAM_ENV = "LOCALINFER_FAKE_RAM"
NVIDIA_SMI_TIMEOUT_S = 3.0

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """``"8GB"``, ``"8 GiB"``, ``"512MB"`` or a plain byte count -> bytes. ValueError if unreadable."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _env_size(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return parse_size(raw)
    except ValueError:
        from localinfer.errors import UsageError

        raise UsageError(f"{name}={raw!r} is not a size", hint="write it like 8GB, 512MiB or a byte count") from None


@dataclass(frozen=True)
class GPU:
    """A GPU found on this machine (whether or not llama.cpp can use it)."""

    name: str
    vendor: str  # nvidia | apple
    memory_total_bytes: int | None
    memory_free_bytes: int | None
    driver: str | None = None
    source: str = ""  # nvml | nvidia-smi | sysctl | LOCALINFER_FAKE_VRAM
    unified: bool = False  # shares the system RAM (Apple Silicon)


@dataclass(frozen=True)
class MemoryBudget:
    """What a load may use: the pre-flight compares the estimate with these."""

    ram_available: int  # RAM the OS can give now, plus free swap, within a cgroup limit
    ram_total: int
    swap_free: int = 0
    gpu_offload: bool = False  # this llama-cpp-python build can offload to a GPU
    vram_free: int | None = None  # free memory over the GPUs llama.cpp sees; None: none
    unified: bool = False  # the GPU's memory is the RAM (Apple Silicon): both come from one pool
    gpu_devices: int = 1  # devices vram_free is summed over (each keeps its own headroom)
    notes: tuple[str, ...] = field(default_factory=tuple)


# -- CPU ----------------------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's marketing name, best effort per OS."""
    if sys.platform.startswith("linux"):
        try:
            for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware", "Processor") and value.strip():
                    return value.strip()
        except OSError:
            pass
    elif sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=2)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_cores() -> tuple[int | None, int | None]:
    """(physical, logical) cores."""
    import psutil

    return psutil.cpu_count(logical=False), psutil.cpu_count(logical=True)


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def parse_system_info(text: str) -> dict[str, dict[str, str]]:
    """llama.cpp's ``llama_print_system_info()`` -> {section: {feature: value}}.

    ``"CPU : SSE3 = 1 | AVX2 = 1 | ... | CUDA : ARCHS = 890 | "`` -> {"CPU": {"SSE3": "1", ...}, "CUDA": {...}}.
    """
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for part in text.split("|"):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"^(\w[\w ]*?)\s*:\s*(.*)$", part)
        if m:  # "CPU : SSE3 = 1" opens a section
            current = sections.setdefault(m.group(1).strip(), {})
            part = m.group(2)
        if current is None:
            current = sections.setdefault("", {})
        key, _, value = part.partition("=")
        if key.strip():
            current[key.strip()] = value.strip()
    return sections


# -- memory -------------------------------------------------------------------------------------------


def _cgroup_room() -> int | None:
    """Bytes left under this process's cgroup memory limit (containers), None when unlimited."""
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            raw = Path(limit_file).read_text().strip()
            if raw == "max":
                return None
            limit = int(raw)
            if limit >= 1 << 60:  # cgroup v1's "unlimited"
                return None
            return max(0, limit - int(Path(usage_file).read_text().strip()))
        except (OSError, ValueError):
            continue
    return None


def memory() -> dict[str, int | None]:
    """RAM total/available, swap free, and the room left under a cgroup limit (bytes)."""
    fast = _proc_meminfo()
    if fast is not None:
        total, available, swap_free = fast
    else:
        import psutil

        vm = psutil.virtual_memory()
        total, available = int(vm.total), int(vm.available)
        try:
            swap_free = int(psutil.swap_memory().free)
        except (OSError, RuntimeError):
            swap_free = 0
    return {
        "total_bytes": total,
        "available_bytes": available,
        "swap_free_bytes": swap_free,
        "cgroup_room_bytes": _cgroup_room(),
    }


def _proc_meminfo() -> tuple[int, int, int] | None:
    """(total, available, swap free) from Linux's /proc/meminfo, the figures psutil reports there.

    Read directly on the path to the first token of ``run``: importing psutil costs ~30 ms. None
    where there is no such file or no MemAvailable line (kernels before 3.14): psutil then decides.
    """
    try:
        with open("/proc/meminfo", "rb") as fh:
            lines = fh.read().split(b"\n")
    except OSError:
        return None
    kib: dict[bytes, int] = {}
    for line in lines:
        key, _, rest = line.partition(b":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            kib[key] = int(parts[0])
    if b"MemAvailable" not in kib or b"MemTotal" not in kib:
        return None
    return kib[b"MemTotal"] * 1024, kib[b"MemAvailable"] * 1024, kib.get(b"SwapFree", 0) * 1024


# -- GPUs ----------------------------------------------------------------------------------------------


def _fake_gpu() -> GPU | None:
    vram = _env_size(FAKE_VRAM_ENV)
    if vram is None:
        return None
    return GPU(f"Simulated NVIDIA GPU ({FAKE_VRAM_ENV})", "nvidia", vram, vram, None, FAKE_VRAM_ENV)


def _nvml_gpus() -> list[GPU] | None:
    try:
        import pynvml  # optional: only if the user installed nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU: say nothing
        return None
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            out.append(GPU(name.decode() if isinstance(name, bytes) else str(name), "nvidia", int(mem.total), int(mem.free), driver, "nvml"))
        return out
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def parse_nvidia_smi(text: str) -> list[GPU]:
    """``nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version --format=csv,noheader,nounits``."""
    out = []
    for line in text.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 4 or not cols[0]:
            continue
        try:
            total, free = int(float(cols[1])) << 20, int(float(cols[2])) << 20  # MiB
        except ValueError:
            total = free = None
        out.append(GPU(cols[0], "nvidia", total, free, cols[3] or None, "nvidia-smi"))
    return out


def _nvidia_smi_gpus(timeout: float = NVIDIA_SMI_TIMEOUT_S) -> list[GPU]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        proc = subprocess.run(
            [exe, "--query-gpu=name,memory.total,memory.free,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_nvidia_smi(proc.stdout) if proc.returncode == 0 else []


def _apple_gpu(ram_total: int) -> GPU | None:
    if sys.platform != "darwin" or platform.machine() != "arm64":
        return None
    # Metal lets the GPU use about 2/3 of RAM up to 36 GB, about 3/4 above (recommendedMaxWorkingSetSize).
    usable = int(ram_total * (2 / 3 if ram_total <= 36 * 1000**3 else 3 / 4))
    return GPU("Apple Silicon GPU (unified memory)", "apple", usable, None, None, "sysctl", unified=True)


def gpus(ram_total: int | None = None) -> list[GPU]:
    """GPUs on this machine, whether or not llama.cpp was built to use them.

    ``LOCALINFER_FAKE_VRAM`` replaces them all with one simulated GPU.
    """
    fake = _fake_gpu()
    if fake is not None:
        return [fake]
    found = _nvml_gpus()
    if found is None:
        found = _nvidia_smi_gpus()
    if not found and ram_total is not None:
        apple = _apple_gpu(ram_total)
        if apple is not None:
            found = [apple]
    return found


# -- llama.cpp ------------------------------------------------------------------------------------------


def _llama_gpu_free() -> tuple[bool, int | None, bool, int]:
    """(offload supported, free bytes over llama.cpp's GPU devices or None, unified memory, devices)."""
    from localinfer.engine import backend as engine

    if not engine.supports_gpu_offload():
        return False, None, False, 0
    gpus_ = [d for d in engine.devices() if d["type"] in ("gpu", "igpu")]
    if not gpus_:
        return True, None, False, 0
    # A remote RPC device's memory is not this machine's RAM, whatever the platform (a mix of the
    # two is planned as separate memory: the budget has one GPU pool).
    remote = any(d.get("backend") == "RPC" for d in gpus_)
    unified = not remote and (sys.platform == "darwin" or all(d["type"] == "igpu" for d in gpus_))
    return True, sum(d["free_bytes"] for d in gpus_), unified, len(gpus_)


def host_room() -> tuple[int, int, int, list[str]]:
    """(RAM available, swap free, RAM total, notes) as a load may use them now: psutil alone (no
    llama.cpp), within a cgroup limit, ``LOCALINFER_FAKE_RAM`` in tests."""
    mem = memory()
    notes: list[str] = []
    swap = int(mem["swap_free_bytes"] or 0)
    ram = int(mem["available_bytes"] or 0)
    room = mem["cgroup_room_bytes"]
    if room is not None and room < ram:
        ram = int(room)
        notes.append("limited by this container's memory limit")
        swap = 0
    fake_ram = _env_size(FAKE_RAM_ENV)
    if fake_ram is not None:
        ram, swap = fake_ram, 0
        notes.append(f"simulated by {FAKE_RAM_ENV}")
    return ram, swap, int(mem["total_bytes"] or 0), notes


def memory_budget() -> MemoryBudget:
    """What a load may use now. Cheap: psutil and llama.cpp's device list, no subprocess."""
    ram, swap, total, notes = host_room()
    offload, vram, unified, n_gpus = _llama_gpu_free()
    fake_vram = _env_size(FAKE_VRAM_ENV)
    if fake_vram is not None and offload:
        vram, unified, n_gpus = fake_vram, False, 1
    return MemoryBudget(
        ram_available=ram + swap,
        ram_total=total,
        swap_free=swap,
        gpu_offload=offload,
        vram_free=vram,
        unified=unified,
        gpu_devices=max(1, n_gpus),
        notes=tuple(notes),
    )
