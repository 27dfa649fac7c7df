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

import builtins
import importlib
import importlib.util
import sys
from importlib.machinery import PathFinder
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
        sys.modules["llama_cpp"] = _unexecuted_package()
        try:
            mod = importlib.import_module("llama_cpp.llama_cpp")
        finally:
            del sys.modules["llama_cpp"]
        _adopt_submodules_later()
        return mod


def _unexecuted_package() -> ModuleType:
    """The ``llama_cpp`` package object, its ``__init__`` not run: its submodules import under it."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("llama-cpp-python is not installed (pip install llama-cpp-python)")
    return importlib.util.module_from_spec(spec)


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

    Importing it runs the package's ``_logger``, which installs llama-cpp-python's own log callback.
    Another thread may be loading or creating a context meanwhile (``chat_format_ahead``), and what
    llama.cpp logs then (memory figures, errors) must reach ours, even if ours is installed only
    while the package imports: its ``llama_log_set`` is a stub until then. Afterwards ours is in
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
_formatter: list[ModuleType] = []  # llama_chat_format, once its import is over


class _Deferred(ModuleType):
    """A stand-in for a module the chat formatter's module imports but rendering never uses (numpy,
    the high-level ``llama_cpp.llama``): any attribute read through it comes from the real module,
    imported then. Handed only to that module's own import statements (``_import_formatter``), never
    put in ``sys.modules``."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(importlib.import_module(self.__name__), attr)


def _import_formatter(c_api: ModuleType) -> ModuleType:
    """``llama_cpp.llama_chat_format``, llama-cpp-python's own module, imported without running the
    package's ``__init__`` (as ``bindings`` does), its imports of numpy and ``llama_cpp.llama`` given
    stand-ins (``_Deferred``): ~40 ms of CPU where the whole package takes ~130. Its
    ``Jinja2ChatFormatter`` and ``format_*`` functions render as they do from the whole package
    (tests/test_engine.py); what runs a ``Llama`` imports the rest when it first uses it. Where the
    package is imported already, that one.

    It stays in ``sys.modules`` with the package's modules it imported (``_logger`` among them), so a
    later ``import llama_cpp`` reuses them (``_logger`` does not install its log callback again) and
    gets them as its attributes (``_AdoptSubmodules``). While it imports, the package object in
    ``sys.modules`` is the unexecuted one: another thread reading from it waits for the import, then
    gets the real package."""
    if "llama_cpp" in sys.modules:
        from llama_cpp import llama_chat_format

        return llama_chat_format
    package = _unexecuted_package()
    # What the package's ``from .llama_cpp import *`` gives its modules (_logger: llama_log_callback,
    # llama_log_set, which is the stub chat_format() hands it).
    package.__dict__.update((k, v) for k, v in vars(c_api).items() if not k.startswith("_"))
    package.llama_cpp = c_api
    importing = [threading.get_ident()]

    def real_package_attr(attr: str) -> Any:  # PEP 562: what the unexecuted package lacks
        if attr.startswith("__") or threading.get_ident() in importing:
            raise AttributeError(f"module 'llama_cpp' has no attribute {attr!r}")
        with _import_lock:  # held until the import below is over and this package is out of sys.modules
            pass
        return getattr(importlib.import_module("llama_cpp"), attr)

    package.__getattr__ = real_package_attr
    stand_ins: dict[str, _Deferred] = {}
    if "numpy" not in sys.modules:  # (where it is, numpy.typing costs little more)
        stand_ins["numpy"] = _Deferred("numpy")
        stand_ins["numpy.typing"] = stand_ins["numpy"].typing = _Deferred("numpy.typing")  # `import numpy.typing as npt`
    if "llama_cpp.llama" not in sys.modules:
        stand_ins["llama_cpp.llama"] = package.llama = _Deferred("llama_cpp.llama")  # `import llama_cpp.llama as llama`
    real_import = builtins.__import__

    def formatter_import(name: str, globals=None, locals=None, fromlist=(), level=0):  # noqa: ANN001, ANN202
        if level == 0 and name in stand_ins:
            if fromlist:
                return stand_ins[name]
            top = name.partition(".")[0]  # `import llama_cpp.llama as llama` binds the top package first
            return stand_ins.get(top) or real_import(top, globals, locals, (), 0)
        return real_import(name, globals, locals, fromlist, level)

    module_spec = PathFinder.find_spec("llama_cpp.llama_chat_format", package.__path__)
    sys.modules["llama_cpp"] = package
    try:
        if module_spec is None or module_spec.loader is None:
            raise ImportError("llama-cpp-python has no llama_chat_format module")
        module = importlib.util.module_from_spec(module_spec)
        module.__builtins__ = {**vars(builtins), "__import__": formatter_import}
        sys.modules[module_spec.name] = module
        try:
            module_spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_spec.name]
            raise
        _adopt_submodules_later()
        return module
    finally:
        if sys.modules.get("llama_cpp") is package:
            del sys.modules["llama_cpp"]
        package.__dict__.pop("llama_log_set", None)  # the stub: _logger keeps this object
        importing.clear()  # from now on the package object forwards to the real package for anyone


class _AdoptSubmodules:
    """A finder for the real ``llama_cpp`` package, imported after its modules were loaded without
    it (``bindings``, ``_import_formatter``): they are in ``sys.modules`` already, so the import
    system would not set them as the package's attributes (``llama_cpp.llama_types``). This sets
    them before the package's ``__init__`` runs; everything else is the normal finder's."""

    def find_spec(self, name: str, path=None, target=None):  # noqa: ANN001, ANN201
        if name != "llama_cpp":
            return None
        spec = PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _AdoptingLoader(spec.loader)
        return spec


class _AdoptingLoader:
    def __init__(self, loader) -> None:  # noqa: ANN001
        self._loader = loader

    def create_module(self, spec):  # noqa: ANN001, ANN201
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        for full, mod in list(sys.modules.items()):
            head, _, tail = full.partition(".")
            if head == "llama_cpp" and tail and "." not in tail and not hasattr(module, tail):
                setattr(module, tail, mod)
        self._loader.exec_module(module)

    def __getattr__(self, attr: str) -> Any:  # get_filename, is_package, get_code...: the real loader's
        return getattr(self._loader, attr)


def _adopt_submodules_later() -> None:
    if not any(isinstance(finder, _AdoptSubmodules) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AdoptSubmodules())


def imported(name: str) -> ModuleType | None:
    """Module ``name`` if it is imported whole already: not one that another thread is importing
    (``chat_format_ahead``), which is in ``sys.modules`` from the start of its import."""
    mod = sys.modules.get(name)
    if mod is None or getattr(getattr(mod, "__spec__", None), "_initializing", False):
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
