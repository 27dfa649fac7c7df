"""Real chat templates for tests: llama.cpp's ``models/templates/*.jinja`` (70 popular models'), read
from the llama-cpp-python sdist that localinfer runs - never committed here.

The sdist is found where the native builds keep it (``LLAMA_CPP_PYTHON_SDIST``, or
``$LOCALINFER_CI_CACHE/sdist``: benchmarks/llama_cpp_source.sh), else in the test cache (``models.cache_dir()``), downloaded there once
with ``pip download``; a test skips, saying why, only when none can be had.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _version() -> str:
    return importlib.metadata.version("llama_cpp_python")


def sdist_path() -> Path | None:
    """The sdist of the installed llama-cpp-python, found or downloaded; None if it cannot be had."""
    name = f"llama_cpp_python-{_version()}.tar.gz"
    env = os.environ.get("LLAMA_CPP_PYTHON_SDIST")
    candidates = [Path(env)] if env else []
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    ci_cache = os.environ.get("LOCALINFER_CI_CACHE") or xdg / "localinfer-ci"
    candidates += [Path(ci_cache) / "sdist" / name, REPO / "benchmarks" / ".build" / "sdist" / name]
    from models import cache_dir

    cache = cache_dir() / "sdist"
    candidates.append(cache / name)
    for path in candidates:
        if path.is_file() and path.name == name:
            return path
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
           f"llama-cpp-python=={_version()}", "-d", str(cache)]  # fmt: skip
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    except (OSError, subprocess.SubprocessError):
        return None
    return cache / name if (cache / name).is_file() else None


@functools.lru_cache(maxsize=1)
def _templates() -> dict[str, str] | None:
    path = sdist_path()
    if path is None:
        return None
    out: dict[str, str] = {}
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if member.isfile() and parts[-2:-1] == ["templates"] and "models" in parts and parts[-1].endswith(".jinja"):
                fh = tar.extractfile(member)
                if fh is not None:
                    out[parts[-1][: -len(".jinja")]] = fh.read().decode("utf-8")
    return out


def real_template(name: str) -> str:
    """llama.cpp's ``models/templates/<name>.jinja``; skips the test when no sdist can be had."""
    templates = _templates()
    if templates is None:
        pytest.skip(f"the llama-cpp-python {_version()} sdist (llama.cpp's real templates) is not here and pip could not download it")
    if name not in templates:
        pytest.fail(f"{name}.jinja is not in the sdist's models/templates (it holds {len(templates)})")
    return templates[name]
