"""Blob lifecycle in the store: split models' shards linked under the names llama.cpp needs, and
blobs deleted once no installed model uses them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from localinfer.store.fsutil import file_lock, try_file_lock
from localinfer.store.manifest import Store


def link_split(store: Store, files: list[dict[str, Any]]) -> Path:
    """Give the shards the names llama.cpp needs (``x-0000i-of-0000n.gguf``) next to each other."""
    folder = store.links_dir / files[0]["sha256"]
    if folder.is_symlink():  # planted: links made through it would land (and old ones be deleted) elsewhere
        folder.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    for rec in files:
        link = folder / rec["filename"].rsplit("/", 1)[-1]
        blob = store.blob_path(rec["sha256"])
        if link.exists():
            try:
                if os.path.samefile(link, blob):
                    continue
            except OSError:
                pass
            link.unlink()
        try:
            os.link(blob, link)
        except OSError:
            os.symlink(blob, link)
    return folder / files[0]["filename"].rsplit("/", 1)[-1]


def gc_blobs(store: Store, candidates: list[str]) -> int:
    """Delete the blobs (and split links) among ``candidates`` that no manifest entry uses; bytes freed.

    Decided and done under the manifest lock: a pull records its entry under that lock only if its
    files still exist (``Store.put(require=...)``), so a blob is never deleted under a new entry. A
    blob another pull is fetching or verifying right now (its lock is held) is left to that pull.
    """
    freed = 0
    with file_lock(store.lock_path("manifest")):
        used = store.digests_in_use()
        for sha in set(candidates) - used:
            blob = store.blob_path(sha)
            with try_file_lock(store.lock_path(f"sha256-{sha}")) as mine:
                if not mine:
                    continue
                if blob.is_file():
                    freed += blob.stat().st_size
                    blob.unlink()
                    store.forget_digest(blob)
            links = store.links_dir / sha
            if links.is_dir():
                shutil.rmtree(links, ignore_errors=True)
    return freed
