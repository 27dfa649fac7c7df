"""llama-cpp-python's ctypes bindings, without the rest of the package, and its chat formatter.

``import llama_cpp`` runs the package's ``__init__``, which imports the high-level ``Llama`` class
and with it numpy and jinja2: ~100 ms of a ~125 ms import, all of it before the first token of a
``run``. The engine only needs the bindings (``llama_cpp.llama_cpp``), so they are imported as the
submodule of a package object whose ``__init__`` has not run; the object is then taken out of
``sys.modules`` again, so that a later ``import llama_cpp`` runs the real ``__init__``, which finds
the bindings already loaded and reuses them. The chat-template formatter (``llama_chat_format``) is
imported the same way, without the numpy and ``Llama`` it never uses for rendering.

Its import runs llama-cpp-python's ``_logger``, which would install the package's own log callback
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

    Importing it runs the package's ``_logger``, which installs llama-cpp-python's own log callback. Another thread may be loading or creating a context meanwhile (``chat_format_ahead``),
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
            mod = _import_formatter(c_api)
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


class _Deferred(ModuleType):
    """A stand-in for a module the chat formatter's module imports but rendering never uses: in
    ``sys.modules`` only while that module is imported (``_import_formatter``); afterwards any
    attribute read through it comes from the real module, imported then."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or sys.modules.get(self.__name__) is self:
            raise AttributeError(attr)
        return getattr(importlib.import_module(self.__name__), attr)


def _import_formatter(c_api: ModuleType) -> ModuleType:
    """``llama_cpp.llama_chat_format``, llama-cpp-python's own module, imported without running the
    package's ``__init__`` (as ``bindings`` does) and with what rendering never uses standing in
    (``_Deferred``): ~40 ms of CPU where the whole package takes ~130. Its ``Jinja2ChatFormatter`` and ``format_*`` functions render
    as they do from the whole package (tests/test_engine.py); the handlers that run a ``Llama``
    import the rest when they first use it. Where the package is imported already, that one.

    It stays in ``sys.modules``: a later ``import llama_cpp`` reuses it (and its ``_logger``, which
    therefore does not install its log callback again)."""
    if "llama_cpp" in sys.modules:
        from llama_cpp import llama_chat_format

        return llama_chat_format
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("llama-cpp-python is not installed (pip install llama-cpp-python)")
    package = importlib.util.module_from_spec(spec)  # a package not yet executed
    # What the package's ``from .llama_cpp import *`` gives its modules (_logger: llama_log_callback,
    # llama_log_set, which is the stub chat_format() hands it).
    package.__dict__.update((k, v) for k, v in vars(c_api).items() if not k.startswith("_"))
    package.llama_cpp = c_api
    # What it imports and rendering never touches: numpy (~45 ms), and the high-level ``Llama``
    # module with multiprocessing, diskcache and numpy again (~60 ms more).
    stand_ins: dict[str, _Deferred] = {}
    if "numpy" not in sys.modules:
        stand_ins["numpy"] = _Deferred("numpy")
        stand_ins["numpy.typing"] = stand_ins["numpy"].typing = _Deferred("numpy.typing")  # for `import numpy.typing as npt`
    if "llama_cpp.llama" not in sys.modules:
        stand_ins["llama_cpp.llama"] = package.llama = _Deferred("llama_cpp.llama")
    sys.modules["llama_cpp"] = package
    sys.modules.update(stand_ins)
    try:
        return importlib.import_module("llama_cpp.llama_chat_format")
    finally:
        for name, stand_in in stand_ins.items():
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]
        if sys.modules.get("llama_cpp") is package:
            del sys.modules["llama_cpp"]


def imported(name: str) -> ModuleType | None:
    """Module ``name`` if it is imported whole already: not one that another thread is importing
    (``chat_format_ahead``), which is in ``sys.modules`` from the start of its import."""
    mod = sys.modules.get(name)
    if mod is None or isinstance(mod, _Deferred) or getattr(getattr(mod, "__spec__", None), "_initializing", False):
        return None
    return mod


def chat_format_ahead(after: threading.Thread | None = None) -> None:
    """Import ``chat_format`` on a thread (~40 ms: jinja2 and the module) while this one waits on llama.cpp
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
