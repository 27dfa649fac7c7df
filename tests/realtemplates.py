"""Real chat templates for tests, read at test time from the llama-cpp-python sdist's vendored
llama.cpp (models/templates/*.jinja): third-party files, never committed here."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from models import cache_dir

SDIST = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"  # benchmarks/llama_cpp_source.sh
TEMPLATES = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/"
REPO = Path(__file__).resolve().parent.parent


def _sdist() -> Path:
    """The sdist: ``LLAMA_CPP_PYTHON_SDIST``, the benchmarks' copy, the test cache, or fetched from PyPI."""
    for path in (os.environ.get("LLAMA_CPP_PYTHON_SDIST"), REPO / "benchmarks/.build/sdist" / SDIST, cache_dir() / "sdist" / SDIST):
        if path and Path(path).is_file():
            return Path(path)
    out = cache_dir() / "sdist"
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                           "llama-cpp-python==0.3.36", "-d", str(out)], capture_output=True, timeout=600)  # fmt: skip
    if proc.returncode != 0 or not (out / SDIST).is_file():
        pytest.skip(f"the llama-cpp-python sdist is not available: {proc.stderr.decode()[-300:]}")
    return out / SDIST


def real_template(name: str) -> str:
    """``models/templates/NAME`` of the vendored llama.cpp (the sdist's sha256 checked)."""
    sdist = _sdist()
    assert hashlib.sha256(sdist.read_bytes()).hexdigest() == SDIST_SHA256, sdist
    with tarfile.open(sdist) as tar:
        member = tar.extractfile(TEMPLATES + name)
        assert member is not None, name
        return member.read().decode()
