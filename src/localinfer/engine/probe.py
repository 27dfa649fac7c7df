"""Whether llama.cpp can load a model file without aborting the process that loads it.

A header can pass every check we make and still make llama.cpp abort (``GGML_ASSERT``, an uncaught
C++ exception: SIGABRT ends the interpreter, no exception to catch). So a file is first loaded in a
child process (``python -m localinfer.engine.probe FILE``): the vocabulary, the weights (mapped), a
small context and one decode, on one thread; and a text that holds every byte value tokenized,
and every token of the vocabulary rendered. :func:`probe_file` runs it and says what happened; the
store remembers the verdict by the file's sha256 (``store.loadable``). Only the child imports
llama_cpp: importing this module costs nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PROBE_CTX = 256  # tokens: llama.cpp pads any smaller context up to 256 anyway
PROBE_DECODE = 4  # tokens of the probe text evaluated (one decode): the ops, not the text, matter


def _probe_text() -> str:
    """Text whose UTF-8 holds every byte value a string can (NUL to 0xF4: ASCII, each lead byte of
    2-, 3- and 4-byte characters, every continuation byte), so tokenizing it reaches each byte-
    fallback token a vocabulary might lack, plus words, digits, white space and a newline."""
    chars = [chr(c) for c in range(0x100)]  # 0x00-0x7F, and C2/C3 with every continuation byte
    chars += [chr(lead << 6) for lead in range(0x04, 0x20)]  # leads C4-DF
    chars += [chr(0xD000 if c == 0xD800 else c) for c in range(0x800, 0x10000, 0x1000)]  # leads E0-EF
    chars += [chr(c) for c in (0x10000, 0x40000, 0x80000, 0xC0000, 0x100000)]  # leads F0-F4
    return "Hello, world! 1234\n\t  café 日本語 🙂 " + "".join(chars)
REFUSED_EXIT = 3  # the child's status when llama.cpp refused the file cleanly (its reason on stdout)
BROKEN_EXIT = 5  # the child's own Python failed: says nothing about the file
STDERR_TAIL = 64 * 1024  # bytes of the child's stderr read back: its last words are at the end
BASE_TIMEOUT_S = 120.0
TIMEOUT_BYTES_PER_S = 20e6  # one decode reads every weight once: allow for a slow disk


@dataclass(frozen=True)
class ProbeResult:
    """What the child said. ``kind``: ok | aborted (the child died) | refused (llama.cpp said no
    without dying; ``error`` names our exception class) | timeout | failed (it could not be run)."""

    kind: str
    message: str = ""
    error: str | None = None
    hint: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


def engine_version() -> str:
    """The llama.cpp a verdict holds for (a new build may refuse, or accept, other files)."""
    found = _version_beside_package()
    if found is None:  # not an ordinary install (editable, zipped...): ask importlib.metadata
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("llama_cpp_python")
        except PackageNotFoundError:
            return "llama-cpp-python (unknown version)"
    return f"llama-cpp-python {found}"


def _version_beside_package() -> str | None:
    """The ``Version:`` of the ``llama_cpp_python-*.dist-info`` next to the ``llama_cpp`` that is
    imported, None where there is not exactly one. Every run checks its model's verdict, and
    importlib.metadata costs ~16 ms of a run's start (it imports email, zipfile, csv and scans
    every entry of sys.path); this reads one directory and one file's header."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or not spec.origin:
            return None
        site = Path(spec.origin).parent.parent
        infos = [n for n in os.listdir(site) if n.lower().startswith("llama_cpp_python-") and n.endswith(".dist-info")]
        if len(infos) != 1:
            return None
        with open(site / infos[0] / "METADATA", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    return None  # the end of the headers
                if line.startswith("Version:"):
                    return line.partition(":")[2].strip() or None
    except (OSError, ValueError, ImportError):
        return None
    return None


def probe_file(path: str | os.PathLike[str], *, timeout: float | None = None) -> ProbeResult:
    """Load ``path`` in a child process and report how that went (never raises for the file's sake)."""
    path = Path(path)
    if timeout is None:
        try:
            size = path.stat().st_size
        except OSError:
            size = 0
        timeout = BASE_TIMEOUT_S + size / TIMEOUT_BYTES_PER_S
    package_root = str(Path(__file__).resolve().parents[2])  # the child imports this very localinfer
    env = {**os.environ, "GGML_NO_BACKTRACE": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (package_root, os.environ.get("PYTHONPATH")) if p
    )}  # fmt: skip
    env.pop("LOCALINFER_DEBUG", None)
    isolate = ["-P"] if sys.version_info >= (3, 11) else []  # no cwd on sys.path: nothing shadows us
    cmd = [sys.executable, *isolate, "-m", "localinfer.engine.probe", os.path.abspath(path)]  # run in "/" (3.10: no -P)
    import tempfile  # here, not at import: a run whose file is proven starts no child

    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=env, timeout=timeout,
                                  cwd=os.sep)
        except subprocess.TimeoutExpired:
            return ProbeResult("timeout", f"llama.cpp did not finish loading it within {timeout:.0f} s", seconds=timeout)
        except OSError as exc:
            return ProbeResult("failed", f"the test process could not start ({exc})")
        seconds = time.perf_counter() - t0
        err.seek(max(err.seek(0, os.SEEK_END) - STDERR_TAIL, 0))
        stderr = err.read().decode("utf-8", errors="replace")
    report = _report(proc.stdout)
    if proc.returncode == 0 and report.get("ok") is True:
        return ProbeResult("ok", seconds=seconds)
    if proc.returncode == BROKEN_EXIT and isinstance(report.get("message"), str):
        return ProbeResult("failed", f"the test process failed: {report['message']}", seconds=seconds)
    if proc.returncode == REFUSED_EXIT and isinstance(report.get("message"), str):
        hint = report.get("hint")
        return ProbeResult("refused", report["message"], str(report.get("error")), hint if isinstance(hint, str) else None, seconds)
    return ProbeResult("aborted", last_words(stderr, proc.returncode), seconds=seconds)


def _report(stdout: bytes) -> dict:
    """The child's one JSON line (the last line of its stdout); {} when there is none."""
    for line in reversed(stdout.decode("utf-8", errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
    return {}


# ggml_abort writes "<source file>:<line>: <message>"; libstdc++'s terminate handler "what():  ..."
_ABORT_LINE = re.compile(r"^\S+\.(?:c|cc|cpp|h|m|cu):\d+: (.+)$")
_WHAT = re.compile(r"^\s*what\(\):\s*(.+)$")


def last_words(stderr: str, returncode: int) -> str:
    """The line that says why the child died: ggml's abort message, a C++ exception's what(), else
    the last error llama.cpp logged, else how it ended."""
    lines = [ln.rstrip() for ln in stderr.splitlines() if ln.strip()]
    for pattern in (_ABORT_LINE, _WHAT):
        for line in reversed(lines):
            m = pattern.match(line)
            if m:
                return _one_line(m.group(1))
    for line in reversed(lines):
        if "terminate called" in line or "error" in line.lower():
            return _one_line(line)
    if returncode < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"the test process exited with status {returncode}"


def _one_line(text: str, limit: int = 300) -> str:
    """Shortened, non-printable characters escaped: a file's own strings may be in the message."""
    text = text.strip()
    safe = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text[:limit])
    return safe + ("..." if len(text) > limit else "")


# ---- the child ---------------------------------------------------------------------------------


def _child(path: str) -> int:
    """Load, decode one prompt, exit 0; a clean refusal prints our error and exits REFUSED_EXIT.
    An abort ends the process by itself: that is what the parent is there to see."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # an abort is expected here: no core file
    except (ImportError, ValueError, OSError):
        pass
    from localinfer.engine.model import LlamaModel
    from localinfer.engine.types import GenerationStats, LoadOptions, SeqJob
    from localinfer.request.sampling import SamplingOptions
    from localinfer.errors import LocalInferError

    options = LoadOptions(n_ctx=PROBE_CTX, n_threads=1, n_threads_batch=1, n_gpu_layers=0, use_mmap=True, verbose=True)
    try:
        with LlamaModel(path, options) as model:
            # what any run may do: tokenize any text (special tokens too), show any token, decode
            text = _probe_text()
            prompt = model.tokenize(text, add_special=True)
            model.tokenize(model.bos_text + text + model.eos_text, add_special=False, parse_special=True)
            for token in range(model.n_vocab):
                model._piece(token, special=True)
            for _step in model.run(SeqJob(0, prompt[:PROBE_DECODE] or [0], SamplingOptions(temperature=0.0), 1), GenerationStats()):
                pass
    except LocalInferError as exc:
        sys.stdout.write(json.dumps({"error": type(exc).__name__, "message": str(exc), "hint": exc.hint}) + "\n")
        return REFUSED_EXIT
    except Exception as exc:  # a bug of ours must not be blamed on the file
        sys.stdout.write(json.dumps({"message": f"{type(exc).__name__}: {exc}"}) + "\n")
        return BROKEN_EXIT
    sys.stdout.write(json.dumps({"ok": True}) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.stderr.write("usage: python -m localinfer.engine.probe FILE.gguf\n")
        sys.exit(2)
    sys.stdout.flush()
    code = _child(sys.argv[1])
    sys.stdout.flush()
    os._exit(code)  # no teardown: the OS frees the model faster (and nothing can assert on the way out)
