"""A helper process that checks large schemas and grammars, so that a server's event loop never waits
on them (issue 40).

The checks are Python (request/structured.py, request/grammar.py). Run in a worker thread they share
the GIL with serve's event loop: while a thread checks, every GIL hand-off to the loop needs the OS
to schedule it, and CPython forces a switch only when no other thread took the GIL meanwhile, so
with two hostile requests being checked the loop waited up to 0.6 s per /health probe on a loaded
2-core machine (benchmarks/health_under_checks.py; CPU contention alone: 50 ms). In this process
they share nothing with the server: the worker thread waits on a pipe, without the GIL.

:func:`enable` turns it on (serve does); then ``structured`` sends a schema or grammar longer than
:data:`OFFLOAD_CHARS` here and small ones are still checked in-thread (a millisecond). One helper
process, started on first use, checks one format at a time; one that dies on a format (that
format's fault) answers a FormatError and the next format starts a new one. The helper's side is
request/checkworker.py (it reads its messages with :func:`read_message`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

OFFLOAD_CHARS = 8 * 1024  # a format this long or longer is checked in the helper (when enabled)

_enabled = False
_lock = threading.Lock()
_proc: subprocess.Popen[bytes] | None = None


def enable(on: bool = True) -> None:
    """Check large formats in the helper process from now on (serve calls it at start)."""
    global _enabled
    _enabled = on
    if not on:
        stop()


def wanted(text: str) -> bool:
    """Whether ``text`` (a schema's JSON or a grammar) goes to the helper."""
    return _enabled and len(text) >= OFFLOAD_CHARS


def check(kind: str, text: str) -> tuple[str, str | None]:
    """``kind`` "schema": check the schema (its compact JSON ``text``); "grammar": convert the GBNF
    ``text`` to Lark. (result, None), or ("", the FormatError's message) as the in-thread checks
    would raise it (request/structured.py raises it)."""
    message = json.dumps({"kind": kind, "text": text}).encode("ascii")  # ASCII: lone surrogates travel too
    with _lock:
        proc = _helper()
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(len(message).to_bytes(4, "big") + message)
            proc.stdin.flush()
            reply = json.loads(read_message(proc.stdout))
        except (OSError, ValueError):
            stop()
            what = "JSON schema" if kind == "schema" else "grammar"
            return "", f"the {what} could not be checked (its checker stopped on it)"
    if "error" in reply:
        return "", str(reply["error"])
    return str(reply["ok"]), None


def stop() -> None:
    """End the helper process, if one runs."""
    global _proc
    proc, _proc = _proc, None
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def _helper() -> subprocess.Popen[bytes]:
    global _proc
    if _proc is None or _proc.poll() is not None:
        package_root = str(Path(__file__).resolve().parents[2])  # the child imports this very localinfer
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
        isolate = ["-P"] if sys.version_info >= (3, 11) else []  # no cwd on sys.path (and run in "/")
        _proc = subprocess.Popen([sys.executable, *isolate, "-m", "localinfer.request.checkworker"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=os.sep)  # fmt: skip
    return _proc


def read_message(stream: object) -> bytes:
    read = stream.read  # type: ignore[attr-defined]
    head = read(4)
    if len(head) < 4:
        raise ValueError("the helper ended")
    body = read(int.from_bytes(head, "big"))
    if len(body) < int.from_bytes(head, "big"):
        raise ValueError("the helper ended")
    return body
