"""llama-cpp-python's ctypes bindings, without the rest of the package, and its chat formatter.

``import llama_cpp`` runs the package's ``__init__``, which imports the high-level ``Llama`` class
and with it numpy and jinja2: ~100 ms of a ~125 ms import, all of it before the first token of a
``run``. The engine only needs the bindings (``llama_cpp.llama_cpp``), so they are imported as the
submodule of a package object whose ``__init__`` has not run; the object is then taken out of
``sys.modules`` again, so that a later ``import llama_cpp`` (the chat-template formatter) runs the
real ``__init__``, which finds the bindings already loaded and reuses them.

Importing the full package installs llama-cpp-python's own log callback (``llama_cpp._logger``)
over ours; ``chat_format()`` puts ours back.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any

_lock = threading.Lock()
_log_callback: list[Any] = []  # [callback] once the engine installed one


def bindings() -> ModuleType:
    """``llama_cpp.llama_cpp`` (the C API), loaded without numpy or jinja2."""
    mod = sys.modules.get("llama_cpp.llama_cpp")
    if mod is not None:
        return mod
    with _lock:
        mod = sys.modules.get("llama_cpp.llama_cpp")
        if mod is not None:
            return mod
        if "llama_cpp" in sys.modules:  # the full package is imported already (or being imported)
            return importlib.import_module("llama_cpp.llama_cpp")
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("llama-cpp-python is not installed (pip install llama-cpp-python)")
        sys.modules["llama_cpp"] = importlib.util.module_from_spec(spec)  # a package not yet executed
        try:
            return importlib.import_module("llama_cpp.llama_cpp")
        finally:
            del sys.modules["llama_cpp"]


def set_log_callback(callback: Any) -> None:
    """Route llama.cpp's log to ``callback`` (a ``llama_log_callback``), now and after ``chat_format``."""
    import ctypes

    _log_callback[:] = [callback]
    bindings().llama_log_set(callback, ctypes.c_void_p(0))


def chat_format() -> ModuleType:
    """``llama_cpp.llama_chat_format`` (its sandboxed Jinja formatter), our log callback kept in place."""
    mod = sys.modules.get("llama_cpp.llama_chat_format")
    if mod is None:
        bindings()
        # Until ours is put back, llama-cpp-python's callback has llama.cpp's log, and it prints every
        # line to stderr unless its logger says otherwise: a load running on another thread (the
        # AMX decoding twin, a load ahead) would print its debug lines on the user's terminal.
        import logging

        logging.getLogger("llama-cpp-python").setLevel(logging.CRITICAL + 1)
        # (It imports numpy too: the CLI keeps numpy's OpenBLAS to one thread, cli.main.)
        from llama_cpp import llama_chat_format as mod

        if _log_callback:  # importing the package just replaced it with llama-cpp-python's logger
            set_log_callback(_log_callback[0])
    return mod

