"""llama-cpp-python's ctypes bindings, without the rest of the package.

``import llama_cpp`` runs the package's ``__init__``, which imports the high-level ``Llama`` class
and numpy with it: most of the package's import time, all of it on the way to a ``run``'s first
token, for nothing the engine uses (benchmarks/results/ has the figures).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType


def bindings() -> ModuleType:
    """``llama_cpp.llama_cpp`` (the C API). Imported as the submodule of a package object whose
    ``__init__`` has not run, which is then taken out of ``sys.modules`` again: a later
    ``import llama_cpp`` runs the real ``__init__``, which finds the bindings loaded and reuses them."""
    if "llama_cpp" in sys.modules or "llama_cpp.llama_cpp" in sys.modules:
        return importlib.import_module("llama_cpp.llama_cpp")
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("llama-cpp-python is not installed (pip install llama-cpp-python)")
    sys.modules["llama_cpp"] = importlib.util.module_from_spec(spec)
    try:
        return importlib.import_module("llama_cpp.llama_cpp")
    finally:
        del sys.modules["llama_cpp"]


def mtmd_bindings() -> ModuleType:
    """``llama_cpp.mtmd_cpp`` (libmtmd, images in), loaded the way :func:`bindings` loads the C API."""
    if "llama_cpp" in sys.modules or "llama_cpp.mtmd_cpp" in sys.modules:
        return importlib.import_module("llama_cpp.mtmd_cpp")
    bindings()
    spec = importlib.util.find_spec("llama_cpp")
    assert spec is not None
    sys.modules["llama_cpp"] = importlib.util.module_from_spec(spec)
    try:
        return importlib.import_module("llama_cpp.mtmd_cpp")
    finally:
        del sys.modules["llama_cpp"]
