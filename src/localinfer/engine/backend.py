"""llama.cpp's process-wide state and what it says about this machine.

The bindings, the one log callback that captures llama.cpp's log, backend initialisation, and the
build's facts: system info, backends, devices, GPU offload, AMX and weight repacking, physical
cores. ``engine.model`` loads and runs models on top of this.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from localinfer.engine.bindings import bindings

llama_cpp = bindings()

LOG_WARN, LOG_ERROR = 3, 4  # ggml_log_level
T = TypeVar("T")


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
        self._callback = llama_cpp.llama_log_callback(self._on_log)
        self.install()

    def install(self) -> None:
        """Make this llama.cpp's log callback (again: importing the whole llama-cpp-python package
        installs its own, which prints every line to stderr)."""
        llama_cpp.llama_log_set(self._callback, ctypes.c_void_p(0))

    def _on_log(self, level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        try:
            message = text.decode("utf-8", errors="replace")
        except Exception:  # never raise into C
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
            except Exception:
                pass

    def tail(self, n: int = 40) -> str:
        return "".join(list(self.lines)[-n:])

    def since(self, seq: int) -> list[tuple[int, str]]:
        """(level, text) of the notable lines logged after line number ``seq``."""
        return [(level, text) for s, level, text in list(self.notable) if s > seq]  # a copy: other threads log


_log: LlamaLog | None = None


def ensure_backend(verbose: bool | None) -> LlamaLog:
    """Start llama.cpp's backend once; ``verbose``: echo its log from now on (None: leave it as it
    is, for the device queries a verbose load makes on its way)."""
    global _log
    if _log is None:
        _log = LlamaLog()
        llama_cpp.llama_backend_init()
    elif "llama_cpp._logger" in sys.modules:  # the whole package was imported since: it took the log over
        _log.install()
    if verbose is not None:
        _log.echo = verbose
    return _log


def reclaim_log() -> None:
    """Make our callback llama.cpp's log again, if the backend is started (see LlamaLog.install)."""
    if _log is not None:
        _log.install()


def interruptible(call: Callable[[], T], *, cancel: threading.Event | None = None, free: Callable[[T], Any] | None = None,
                  meanwhile: Callable[[], None] | None = None) -> T:  # fmt: skip
    """``call()``, llama.cpp work that logs as it goes (a model's load, a context's creation), made
    safe to interrupt; ``meanwhile()``, Python work for later, runs beside it on a helper thread.

    Python runs a signal's handler on the main thread at its next bytecode, and during a load that
    is inside our log callback (thousands of lines), where ctypes prints the KeyboardInterrupt as
    an ignored exception and drops it: the load, and the command, went on. So while ``call()`` runs
    on the main thread, Ctrl-C only sets ``cancel`` (a model's load checks it between tensors) and
    is raised once the call is back, what it made given to ``free``. The call stays on this thread:
    on another, llama.cpp's many small allocations would go to a new malloc arena, grown a page
    range at a time (~1,200 more mprotect calls for SmolLM2, ~8 ms). ``meanwhile``'s own errors
    are ignored: it prepares what is done again later for real."""
    helper = None
    if meanwhile is not None:
        helper = threading.Thread(target=_quietly, args=(meanwhile,), name="localinfer-meanwhile", daemon=True)
        helper.start()
    interrupted: list[int] = []
    swap = threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if swap:
        cancel = cancel or threading.Event()

        def on_sigint(signum: int, _frame: Any) -> None:
            interrupted.append(signum)
            cancel.set()

        signal.signal(signal.SIGINT, on_sigint)
    try:
        value = call()
    finally:
        try:
            if helper is not None:
                helper.join()
        finally:
            if swap:
                signal.signal(signal.SIGINT, signal.default_int_handler)
    if interrupted:
        if value and free is not None:
            free(value)
        raise KeyboardInterrupt
    return value


def _quietly(work: Callable[[], None]) -> None:
    try:
        work()
    except Exception:
        pass


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
        ("ggml_backend_dev_backend_reg", p, [p]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def backends() -> list[str]:
    """Backends compiled into this llama-cpp-python (``["CUDA", "CPU"]``, ``["Metal", "BLAS", "CPU"]``)."""
    ensure_backend(None)
    try:
        lib = _ggml()
        names = [lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)).decode() for i in range(lib.ggml_backend_reg_count())]
    except (AttributeError, OSError, RuntimeError):
        return []
    return [n for n in names if not n.startswith("RPC[")]  # "RPC[host:port]": a server added (engine.rpc), not a backend


def devices() -> list[dict]:
    """The devices llama.cpp can use: name, description, type (cpu/gpu/igpu/accel), free and total
    bytes, and the backend that drives it (CPU, CUDA, Metal, RPC: a remote ggml-rpc-server)."""
    ensure_backend(None)
    try:
        lib = _ggml()
    except (AttributeError, OSError, RuntimeError):
        return []
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        reg = lib.ggml_backend_dev_backend_reg(dev)
        out.append(
            {
                "name": (lib.ggml_backend_dev_name(dev) or b"").decode(errors="replace"),
                "description": (lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                "type": _DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev), "other"),
                "free_bytes": int(free.value),
                "total_bytes": int(total.value),
                "backend": (lib.ggml_backend_reg_name(reg) or b"").decode(errors="replace") if reg else "",
            }
        )
    return out


def load_mode(use_mmap: bool, use_mlock: bool) -> int:
    if use_mmap:
        return llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK if use_mlock else llama_cpp.LLAMA_LOAD_MODE_MMAP
    return llama_cpp.LLAMA_LOAD_MODE_MLOCK if use_mlock else llama_cpp.LLAMA_LOAD_MODE_NONE


def cpu_has_amx() -> bool:
    return "AMX_INT8 = 1" in system_info()


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

