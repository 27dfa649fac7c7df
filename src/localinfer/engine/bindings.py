"""llama-cpp-python's ctypes bindings, without the rest of the package, and its chat formatter.

``import llama_cpp`` runs the package's ``__init__``, which imports the high-level ``Llama`` class
and with it numpy and jinja2: ~100 ms of a ~125 ms import, all of it before the first token of a
``run``. The engine only needs the bindings (``llama_cpp.llama_cpp``), so they are imported as the
submodule of a package object whose ``__init__`` has not run; the object is then taken out of
``sys.modules`` again, so that a later ``import llama_cpp`` (the chat-template formatter) runs the
real ``__init__``, which finds the bindings already loaded and reuses them.

Importing the full package would install llama-cpp-python's own log callback (``llama_cpp._logger``)
over ours; ``chat_format()`` keeps ours in place throughout, so that it can be imported on a thread
(``chat_format_ahead``) while a model loads, whose log lines are parsed.
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
    _llama_log_set()(callback, ctypes.c_void_p(0))


def _llama_log_set() -> Any:
    """The real ``llama_log_set`` (``chat_format`` stands a stub in for it while the package imports)."""
    return _real_log_set[0] if _real_log_set else bindings().llama_log_set


_real_log_set: list[Any] = []


def chat_format() -> ModuleType:
    """``llama_cpp.llama_chat_format`` (its sandboxed Jinja formatter), our log callback kept in place.

    Importing it runs the package's ``__init__``, whose ``_logger`` installs llama-cpp-python's own
    log callback. Another thread may be loading or creating a context meanwhile (``chat_format_ahead``),
    and what llama.cpp logs then (memory figures, errors) must reach ours, even if ours is installed
    only while the package imports: its ``llama_log_set`` is a stub until then. Afterwards ours is in
    place, or, where the engine installed none (a library use), the package's own."""
    if _formatter:  # not sys.modules: a module being imported on another thread is there half-made
        return _formatter[0]
    with _import_lock:
        if _formatter:
            return _formatter[0]
        c_api = bindings()
        # The package's callback prints every line to stderr unless its logger says otherwise.
        import ctypes
        import logging

        logging.getLogger("llama-cpp-python").setLevel(logging.CRITICAL + 1)
        real = c_api.llama_log_set
        _real_log_set[:] = [real]
        c_api.llama_log_set = lambda *_args: None  # what ``from .llama_cpp import *`` hands _logger
        try:
            # (It imports numpy too: the CLI keeps numpy's OpenBLAS to one thread, cli.main.)
            from llama_cpp import llama_chat_format as mod
        finally:
            c_api.llama_log_set = real
            package = sys.modules.get("llama_cpp")
            if package is not None and getattr(package, "llama_log_set", real) is not real:
                package.llama_log_set = real
            _real_log_set.clear()
            theirs = getattr(sys.modules.get("llama_cpp._logger"), "llama_log_callback", None)
            if _log_callback:
                set_log_callback(_log_callback[0])
            elif theirs is not None:
                real(theirs, ctypes.c_void_p(0))
        _formatter.append(mod)
    return mod


_import_lock = threading.Lock()
_formatter: list[ModuleType] = []  # llama_chat_format, once imported whole


def imported(name: str) -> ModuleType | None:
    """Module ``name`` if it is imported whole already: not one that another thread is importing
    (``chat_format_ahead``), which is in ``sys.modules`` from the start of its import."""
    mod = sys.modules.get(name)
    if mod is None or getattr(getattr(mod, "__spec__", None), "_initializing", False):
        return None
    return mod


def chat_format_ahead(after: threading.Thread | None = None) -> None:
    """Import ``chat_format`` on a thread (~70 ms: numpy and jinja2) while this one waits on llama.cpp
    (a load, a context's creation) with the GIL released: the prompt's template is then rendered
    without waiting for it. ``after``: a thread loading weights ahead, to let finish first (the
    import would slow it down more than it gains: each line llama.cpp logs needs the GIL)."""
    if _formatter:
        return

    def run() -> None:
        if after is not None:
            after.join()
        try:
            chat_format()
        except Exception:  # noqa: BLE001 - only a head start: rendering imports it again and reports
            pass

    thread = threading.Thread(target=run, name="localinfer-chat-format")  # not a daemon: see settle()
    _importing[:] = [thread]
    thread.start()


_importing: list[threading.Thread] = []  # chat_format_ahead's thread


def settle() -> None:
    """Wait for ``chat_format_ahead``'s import before the interpreter exits, Ctrl-C or not: an
    import must not run on while the interpreter shuts down."""
    for thread in _importing:
        while thread.is_alive():
            try:
                thread.join()
            except KeyboardInterrupt:
                continue
