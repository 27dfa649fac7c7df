"""The test suite's witness of llama.cpp's use (tests/conftest.py's ``llama`` check), from outside the
package: an import hook wraps the engine's entries to llama.cpp (loading the bindings, starting the
backend, asking about the build) so that each call appends this process's id to the file
LOCALINFER_TEST_LLAMA_LOG names. conftest installs it in the suite's process and puts this folder
on PYTHONPATH, so every Python child the tests start imports it as its ``sitecustomize``. The folder
holds nothing else: nothing of the tests' shadows a module in the children. Standard library only,
and cheap: every child pays for it at startup."""

from __future__ import annotations

import os
import sys

LOG = "LOCALINFER_TEST_LLAMA_LOG"
# the functions through which the engine reaches llama.cpp, by module (each call is a use; bindings'
# only where it loads the library)
ENTRIES = {
    "localinfer.engine.bindings": ("bindings",),
    "localinfer.engine.backend": ("ensure_backend", "supports_gpu_offload", "system_info"),
}


def note_use() -> None:
    path = os.environ.get(LOG)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")


def _loads_library() -> bool:
    return "llama_cpp" not in sys.modules and "llama_cpp.llama_cpp" not in sys.modules


def _noted(fn, when=None):
    def noted(*args, **kwargs):
        if when is None or when():
            note_use()
        return fn(*args, **kwargs)

    noted.__name__, noted.__qualname__, noted.__doc__, noted.__wrapped__ = fn.__name__, fn.__qualname__, fn.__doc__, fn
    return noted


def _wrap(module) -> None:
    # before the importer gets the module: a `from ... import bindings` elsewhere takes the wrapped one
    for name in ENTRIES[module.__name__]:
        fn = module.__dict__[name]
        if not hasattr(fn, "__wrapped__"):
            setattr(module, name, _noted(fn, _loads_library if name == "bindings" else None))


class _Loader:
    """The module's own loader, which then wraps the module's entries."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def __getattr__(self, name: str):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _wrap(module)


class Witness:
    """A finder on ``sys.meta_path`` for the modules in ENTRIES: the spec the other finders give, its
    loader wrapped."""

    llama_witness = True

    def find_spec(self, name: str, path=None, target=None):
        if name not in ENTRIES:
            return None
        for finder in sys.meta_path:
            if getattr(finder, "llama_witness", False) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    """Once per process (a child of the suite has it from startup)."""
    if any(getattr(f, "llama_witness", False) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, Witness())
    for name in ENTRIES:  # imported before the hook (the suite's own process only): wrapped where they are
        if name in sys.modules:
            _wrap(sys.modules[name])


install()
