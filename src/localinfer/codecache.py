"""The code of our dataclasses' generated methods, compiled once and kept beside our bytecode.

``@dataclass`` writes each class's ``__init__``, ``__repr__``, ``__eq__`` (and for a frozen one
``__setattr__``, ``__delattr__``, ``__hash__``) as source text and compiles it, every time the class
is created: ~200 compilations on the way to a ``run``'s model load, ~19 ms of its ~130 ms of Python
(issue 40; benchmarks/results/startup-2026-12-04.txt). The text is the same from one process to the
next, so its compiled code is kept, as Python keeps a module's, in ``__pycache__`` (marshal, tagged
with the interpreter's bytecode magic), and executed from there: the same code as compiling the text
again. Only our own modules' classes use it; written (at exit) only where Python writes bytecode.
"""

from __future__ import annotations

import builtins
import marshal
import os
import sys
from typing import Any

_MAX = 4096  # entries kept; past it, a rewrite keeps what this process used
_HEADER = b"localinfer dataclass code\n"


def _magic() -> bytes:
    return sys.modules["_frozen_importlib_external"].MAGIC_NUMBER  # the bytecode's version


_path = os.path.join(os.path.dirname(__file__), "__pycache__", f"dataclass-code.{sys.implementation.cache_tag}.marshal")
_codes: dict[str, Any] = {}
_used: set[str] = set()
_added = _loaded = False


def _load() -> None:
    global _loaded
    _loaded = True
    try:
        with open(_path, "rb") as f:
            data = f.read()
        head = _HEADER + _magic()
        if data.startswith(head):
            codes = marshal.loads(data[len(head) :])
            if isinstance(codes, dict):
                _codes.update(codes)
    except (OSError, ValueError, EOFError, TypeError):
        pass  # no cache (or another interpreter's): the text is compiled as before


def _exec(source: Any, globals: Any = None, locals: Any = None) -> None:
    """dataclasses' ``exec``: the text's code from the cache, for our modules' classes."""
    global _added
    if not isinstance(source, str) or not isinstance(globals, dict) or not str(globals.get("__name__", "")).startswith("localinfer."):
        builtins.exec(source, globals, locals)
        return
    if not _loaded:  # read on our first class, not at import (`--help` creates none)
        _load()
    code = _codes.get(source)
    if code is None:
        # as exec(text) in dataclasses compiles it: "<string>", no __future__ flags of ours
        code = _codes[source] = compile(source, "<string>", "exec", dont_inherit=True)
        if not _added and not sys.dont_write_bytecode:
            import atexit

            atexit.register(_save)
        _added = True
    _used.add(source)
    builtins.exec(code, globals, locals)


def _save() -> None:
    codes = _codes if len(_codes) <= _MAX else {k: v for k, v in _codes.items() if k in _used}
    tmp = f"{_path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(_path), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(_HEADER + _magic() + marshal.dumps(codes))
        os.replace(tmp, _path)
    except (OSError, ValueError):
        try:
            os.unlink(tmp)
        except OSError:
            pass


def install() -> None:
    """From now on, dataclasses compiles our classes' methods through the cache (once per process)."""
    import dataclasses

    dataclasses.exec = _exec  # type: ignore[attr-defined]  # a module global: found before the builtin
