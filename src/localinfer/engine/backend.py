"""llama.cpp's process-wide state and what it says about this machine.

The bindings (without llama-cpp-python's numpy-importing ``__init__``), the one log callback that
captures llama.cpp's log, backend initialisation, and the build's facts: system info, backends,
devices, GPU offload, AMX and weight repacking, physical cores. ``engine.llama`` loads and runs
models on top of this.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator

from localinfer.engine import bindings as _bindings

llama_cpp = _bindings.bindings()  # the C API only: not the package's numpy/jinja2-importing __init__

LOG_WARN, LOG_ERROR = 3, 4  # ggml_log_level


class LlamaLog:
    """llama.cpp's log, captured (for error messages) and echoed to stderr only when verbose.

    llama.cpp has one process-wide log callback, so this is the one piece of process state we keep.
    """

    def __init__(self) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=400)
        # Warnings, errors and memory figures, kept apart: a load logs thousands of debug lines that
        # would push them out of ``lines``. (seq, level, text); ``seq`` counts every line logged.
        self.notable: collections.deque[tuple[int, int, str]] = collections.deque(maxlen=512)
        self.seq = 0
        self.echo = False
        self.muted: set[int] = set()  # threads whose lines are kept out (see log_muted)
        self._callback = llama_cpp.llama_log_callback(self._on_log)
        _bindings.set_log_callback(self._callback)

    def _on_log(self, level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        try:
            message = text.decode("utf-8", errors="replace")
        except Exception:  # noqa: BLE001 - never raise into C
            return
        if self.muted and threading.get_ident() in self.muted:
            self._echo(message)
            return
        self.lines.append(message)
        self.seq += 1
        if level in (LOG_WARN, LOG_ERROR) or "buffer size =" in message or "offloaded" in message:
            self.notable.append((self.seq, level, message))
        self._echo(message)

    def _echo(self, message: str) -> None:
        if self.echo:
            try:
                sys.stderr.write(message)
            except Exception:  # noqa: BLE001
                pass

    def tail(self, n: int = 40) -> str:
        return "".join(list(self.lines)[-n:])

    def since(self, seq: int) -> list[tuple[int, str]]:
        """(level, text) of the notable lines logged after line number ``seq``."""
        return [(level, text) for s, level, text in list(self.notable) if s > seq]  # a copy: other threads log


_log: LlamaLog | None = None


def ensure_backend(verbose: bool) -> LlamaLog:
    global _log
    if _log is None:
        _log = LlamaLog()
        llama_cpp.llama_backend_init()
    _log.echo = verbose
    return _log


@contextlib.contextmanager
def log_muted() -> Iterator[None]:
    """Keep what llama.cpp logs from this thread out of the captured log (still echoed when verbose):
    a load running beside another one (the AMX decoding twin) must not land in that load's report,
    which is parsed for its memory figures and its errors."""
    log = _log  # not ensure_backend(): from this thread it would write the verbose flag back racily
    if log is None:  # no backend yet: nothing of ours to keep lines out of
        yield
        return
    me = threading.get_ident()
    log.muted.add(me)
    try:
        yield
    finally:
        log.muted.discard(me)


def join_past_interrupts(thread) -> None:  # noqa: ANN001 - a threading.Thread
    """Wait for a thread running a llama.cpp load: llama.cpp must not be mid-load when its model is
    freed or the interpreter exits. A Ctrl-C (even a second one) does not cut the wait short."""
    while thread.is_alive():
        try:
            thread.join()
        except KeyboardInterrupt:
            continue


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """While llama.cpp loads, anything it prints on fd 1 goes to fd 2: stdout is for the model's text."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def openmp_one_thread() -> bool:
    """Keep the OpenMP teams this thread starts to itself (``omp_set_num_threads(1)`` sets the calling
    thread's own setting); whether the build's OpenMP runtime was found (Linux: the one mapped in).

    For a thread running llama.cpp beside the main one (the AMX decoding twin's load, whose weight
    conversion runs an OpenMP team): a team's workers live as long as the thread that started it, and
    once libgomp manages more threads than there are CPUs it makes every barrier sleep at once rather
    than spin. ggml's graph compute meets at a barrier after each operation, so a second team of
    two slowed the prompt's evaluation from ~30 to ~50 ms on 2 cores (SmolLM2).
    """
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split(maxsplit=5)[-1].strip() for line in maps if ".so" in line}
    except OSError:
        return False
    found = False
    for path in sorted(paths):  # libgomp.so.1, a wheel's libgomp-1a2b3c4d.so.1, LLVM's libomp, Intel's libiomp5
        if re.match(r"lib(gomp|omp|iomp5)[-.]", os.path.basename(path)):  # each: another wheel may map its own
            try:
                ctypes.CDLL(path).omp_set_num_threads(1)
            except (OSError, AttributeError):
                continue
            found = True
    return found


def default_threads() -> int:
    """Physical cores (what llama.cpp recommends); logical cores when that is unknown."""
    cores = _sysfs_physical_cores()
    if cores is None:
        import psutil

        cores = psutil.cpu_count(logical=False)
    return cores or os.cpu_count() or 1


def _sysfs_physical_cores() -> int | None:
    """Linux: the CPUs' distinct sibling sets in sysfs, the count psutil reports there (its first
    method). Read directly: ``run`` asks for it just before creating the context, on the way to the
    first token, and importing psutil costs ~25 ms. None where sysfs does not say (psutil decides)."""
    import glob

    for pattern in ("core_cpus_list", "thread_siblings_list"):  # the second: the older name
        siblings = set()
        for path in glob.glob(f"/sys/devices/system/cpu/cpu[0-9]*/topology/{pattern}"):
            try:
                with open(path, "rb") as fh:
                    siblings.add(fh.read().strip())
            except OSError:
                return None
        if siblings:
            return len(siblings)
    return None


def supports_gpu_offload() -> bool:
    return bool(llama_cpp.llama_supports_gpu_offload())


def system_info() -> str:
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")


_DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}  # enum ggml_backend_dev_type


def _ggml():
    """ggml's C API for backends and devices (not bound by llama-cpp-python; same library, via ctypes)."""
    lib = llama_cpp._lib
    if not hasattr(lib, "ggml_backend_dev_count"):  # Windows: symbols of a dependency are not visible
        from llama_cpp._ctypes_extensions import load_shared_library

        lib = load_shared_library("ggml", llama_cpp._base_path)
    p = ctypes.c_void_p
    for name, res, args in (
        ("ggml_backend_reg_count", ctypes.c_size_t, []),
        ("ggml_backend_reg_get", p, [ctypes.c_size_t]),
        ("ggml_backend_reg_name", ctypes.c_char_p, [p]),
        ("ggml_backend_dev_count", ctypes.c_size_t, []),
        ("ggml_backend_dev_get", p, [ctypes.c_size_t]),
        ("ggml_backend_dev_name", ctypes.c_char_p, [p]),
        ("ggml_backend_dev_description", ctypes.c_char_p, [p]),
        ("ggml_backend_dev_type", ctypes.c_int, [p]),
        ("ggml_backend_dev_memory", None, [p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def backends() -> list[str]:
    """Backends compiled into this llama-cpp-python (``["CUDA", "CPU"]``, ``["Metal", "BLAS", "CPU"]``)."""
    ensure_backend(False)
    try:
        lib = _ggml()
        return [lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)).decode() for i in range(lib.ggml_backend_reg_count())]
    except (AttributeError, OSError, RuntimeError):
        return []


def devices() -> list[dict]:
    """The devices llama.cpp can use: name, description, type (cpu/gpu/igpu/accel), free and total bytes."""
    ensure_backend(False)
    try:
        lib = _ggml()
    except (AttributeError, OSError, RuntimeError):
        return []
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(
            {
                "name": (lib.ggml_backend_dev_name(dev) or b"").decode(errors="replace"),
                "description": (lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                "type": _DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev), "other"),
                "free_bytes": int(free.value),
                "total_bytes": int(total.value),
            }
        )
    return out


def load_mode(use_mmap: bool, use_mlock: bool) -> int:
    if use_mmap:
        return llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK if use_mlock else llama_cpp.LLAMA_LOAD_MODE_MMAP
    return llama_cpp.LLAMA_LOAD_MODE_MLOCK if use_mlock else llama_cpp.LLAMA_LOAD_MODE_NONE


def cpu_has_amx() -> bool:
    return "AMX_INT8 = 1" in system_info()


def cpu_has_avx512_bf16() -> bool:
    return "AVX512_BF16 = 1" in system_info()


# The float ggml types a KV cache can have (enum ggml_type; llama-cpp-python names no BF16), and
# their bytes per value
GGML_F32, GGML_F16, GGML_BF16 = 0, 1, 30
GGML_FLOAT_BYTES = {GGML_F32: 4, GGML_F16: 2, GGML_BF16: 2}

_row_converters: dict[tuple[int, int], Callable[[int, int, int], None]] = {}
_ROW_NAMES = {GGML_F32: None, GGML_F16: "fp16", GGML_BF16: "bf16"}
_ROW_CHUNK = 1 << 15  # values converted at a time through F32: 128 KB that stay in cache


def ggml_row_converter(src: int, dst: int) -> Callable[[int, int, int], None] | None:
    """ggml's row conversion between two ggml types through F32 (``ggml_fp16_to_fp32_row``,
    ``ggml_fp32_to_bf16_row``, ...: its own rounding, to nearest even), as ``convert(src_address,
    dst_address, n)``; None for a pair it has no functions for. Only F32, F16 and BF16."""
    if (src, dst) in _row_converters:
        return _row_converters[(src, dst)]
    if src not in _ROW_NAMES or dst not in _ROW_NAMES or src == dst:
        return None
    names = [f"ggml_{_ROW_NAMES[src]}_to_fp32_row"] if _ROW_NAMES[src] else []
    names += [f"ggml_fp32_to_{_ROW_NAMES[dst]}_row"] if _ROW_NAMES[dst] else []
    try:
        lib = llama_cpp._lib
        if not hasattr(lib, names[0]):  # Windows: a dependency's symbols are not visible; ggml-base has them
            from llama_cpp._ctypes_extensions import load_shared_library

            lib = load_shared_library("ggml-base", llama_cpp._base_path)
        steps = [getattr(lib, name) for name in names]
    except (AttributeError, OSError, RuntimeError):
        return None
    p, n = ctypes.c_void_p, ctypes.c_int64
    for fn in steps:
        fn.restype, fn.argtypes = None, [p, p, n]
    src_size, dst_size = GGML_FLOAT_BYTES[src], GGML_FLOAT_BYTES[dst]

    def convert(src_address: int, dst_address: int, count: int) -> None:
        middle = (ctypes.c_float * min(count, _ROW_CHUNK))() if len(steps) == 2 else None
        for start in range(0, count, _ROW_CHUNK):  # also keeps each call's count well within ggml's int
            part = min(_ROW_CHUNK, count - start)
            src_at, dst_at = src_address + start * src_size, dst_address + start * dst_size
            if middle is None:
                steps[0](src_at, dst_at, part)
            else:
                steps[0](src_at, ctypes.addressof(middle), part)
                steps[1](ctypes.addressof(middle), dst_at, part)

    _row_converters[(src, dst)] = convert
    return convert


def cpu_repack_enabled(requested: bool | None) -> bool:
    """Whether llama.cpp may repack weights into CPU "extra" buffers (AMX, AVX/ARM repack).

    Default: on, except on CPUs with AMX, where llama.cpp's AMX matmul segfaults on the first
    batched decode (ggml-org/llama.cpp#20824, seen here with SmolLM2 Q4_1 on Sapphire Rapids).
    ``LOCALINFER_CPU_REPACK=1|0`` or ``--cpu-repack/--no-cpu-repack`` decide explicitly.
    """
    if requested is not None:
        return requested
    env = os.environ.get("LOCALINFER_CPU_REPACK", "").strip().lower()
    if env in ("1", "true", "yes", "on"):
        return True
    if env in ("0", "false", "no", "off"):
        return False
    return not cpu_has_amx()

