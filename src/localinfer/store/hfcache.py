"""Taking a file a pull needs from huggingface_hub's own cache (``HF_HOME``), verified, instead of
downloading it again (store.pull)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from localinfer.errors import ChecksumError, InvalidModelError
from localinfer.store.fsutil import fsync_dir, open_in_store
from localinfer.store.install import read_header, verify_file
from localinfer.store.manifest import Store
from localinfer.store.types import ProgressSink


def _copy_into_store(src: Path, dest: Path) -> None:
    """Copy ``src`` to ``dest`` in the store, never writing through a link planted at ``dest``."""
    with src.open("rb") as fin, os.fdopen(open_in_store(dest, os.O_WRONLY | os.O_TRUNC), "wb") as fout:
        shutil.copyfileobj(fin, fout, 4 * 1024 * 1024)


def reuse_hf_cache(
    store: Store, *, repo: str, filename: str, size: int | None, sha256: str, progress: ProgressSink
) -> tuple[Path, Any] | None:
    """Take a verified copy of the file from huggingface_hub's cache (hard link, else copy); None if absent."""
    from localinfer.store.sources import hub

    cached = hub.hf_cached_blob(repo, sha256, size)
    if cached is None:
        return None
    tmp = store.partial_dir / f"sha256-{sha256}.hfcache"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(cached, tmp)
        except OSError:
            _copy_into_store(cached, tmp)
        progress.note(f"{filename}: found in the Hugging Face cache ({cached}), verifying it")
        verify_file(store, tmp, sha256, force=True, progress=progress, label=f"verifying {filename}")
        info = read_header(tmp)
    except (OSError, ChecksumError, InvalidModelError):
        tmp.unlink(missing_ok=True)
        progress.note(f"{filename}: the cached copy is not usable; downloading it")
        return None
    blob = store.blob_path(sha256)
    blob.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, blob)
    fsync_dir(blob.parent)
    store.record_digest(blob, sha256)
    return blob, info
