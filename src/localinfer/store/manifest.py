"""The store on disk: content-addressed blobs, partial downloads, locks and the manifest.

Layout under :func:`localinfer.paths.models_dir`::

    manifest.json          installed models (name -> entry), written atomically under manifest.lock
    verified.json          digest cache: path -> (size, mtime_ns, inode, dev, sha256)
    blobs/sha256-<hex>     verified model files, named by their content
    partial/sha256-<hex>.part   downloads in progress (resumed by the next pull)
    links/<hex>/<name>     split models: shard names llama.cpp needs, hard-linked to the blobs
    locks/                 per-file locks so two pulls of the same bytes do not collide

A model is in the manifest only once every one of its files is complete, verified and in place.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from localinfer.store.fsutil import atomic_write_json, file_lock, read_json, stat_key, try_file_lock

MANIFEST_VERSION = 1


TOUCH_EVERY_S = 60  # "last used" is recorded at most this often per model (Store.touch)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def boot_id() -> str:
    """Identifies this run of the machine: it changes at every restart (and so after any crash)."""
    from localinfer.paths import boot_id as os_boot_id

    named = os_boot_id()
    if named is not None:
        return named
    import psutil

    return f"boot-{int(psutil.boot_time())}"


PARTIAL_MAX_AGE_S = 7 * 24 * 3600  # an unfinished download left alone this long is deleted by the next pull


class _Gone(Exception):
    pass


class Store:
    """Paths and manifest operations of one store root (``models_dir()`` unless given)."""

    def __init__(self, root: Path | None = None) -> None:
        if root is None:
            from localinfer.paths import models_dir

            root = models_dir()
        self.root = Path(root)

    # ---- layout -------------------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    @property
    def verified_path(self) -> Path:
        return self.root / "verified.json"

    @property
    def blobs_dir(self) -> Path:
        return self.root / "blobs"

    @property
    def partial_dir(self) -> Path:
        return self.root / "partial"

    @property
    def links_dir(self) -> Path:
        return self.root / "links"

    @property
    def locks_dir(self) -> Path:
        return self.root / "locks"

    def blob_path(self, sha256: str) -> Path:
        return self.blobs_dir / f"sha256-{sha256}"

    def partial_path(self, sha256: str) -> Path:
        return self.partial_dir / f"sha256-{sha256}.part"

    def lock_path(self, key: str) -> Path:
        return self.locks_dir / f"{key}.lock"

    # ---- manifest -----------------------------------------------------------------------------
    def _read(self) -> dict[str, Any]:
        try:
            data = read_json(self.manifest_path, None)
        except (ValueError, UnicodeDecodeError) as exc:
            from localinfer.errors import LocalInferError

            raise LocalInferError(
                f"the model manifest {self.manifest_path} is unreadable ({exc})",
                hint="move it aside; installed models can then be pulled again (their blobs are reused)",
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
            data = {"version": MANIFEST_VERSION, "models": {}}
        return data

    def entries(self) -> dict[str, dict[str, Any]]:
        """A snapshot of the installed models (readers need no lock: writes are atomic renames)."""
        return self._read()["models"]

    def entry(self, name: str) -> dict[str, Any] | None:
        return self.entries().get(name)

    @contextlib.contextmanager
    def edit(self) -> Iterator[dict[str, dict[str, Any]]]:
        """Read-modify-write of the models table under the manifest lock; written only if no exception."""
        with file_lock(self.lock_path("manifest")):
            data = self._read()
            models = data["models"]
            yield models
            data["version"] = MANIFEST_VERSION
            atomic_write_json(self.manifest_path, data)

    def put(self, entry: dict[str, Any], *, require: Iterable[Path] = ()) -> bool:
        """Record ``entry``; False (nothing written) if a file of ``require`` is gone by then.

        ``gc_blobs`` decides and deletes under the same manifest lock, so a blob checked here cannot
        disappear before the entry that uses it is on disk.
        """
        try:
            with self.edit() as models:
                if any(not p.is_file() for p in require):
                    raise _Gone
                old = models.get(entry["name"])
                if old is not None and old.get("last_used") and not entry.get("last_used"):
                    entry["last_used"] = old["last_used"]
                models[entry["name"]] = entry
        except _Gone:
            return False
        return True

    def prune_partials(self, max_age_s: float = PARTIAL_MAX_AGE_S) -> list[Path]:
        """Delete downloads in ``partial/`` untouched for ``max_age_s`` (a file that changed upstream
        leaves its old partial behind for good). A partial whose lock another pull holds is in use."""
        import time

        gone = []
        cutoff = time.time() - max_age_s
        try:
            candidates = sorted(self.partial_dir.glob("sha256-*.part"))
        except OSError:
            return gone
        for path in candidates:
            try:
                if path.stat().st_mtime >= cutoff:
                    continue
                with try_file_lock(self.lock_path(path.name.removesuffix(".part"))) as mine:
                    if mine and path.stat().st_mtime < cutoff:
                        path.unlink()
                        gone.append(path)
            except OSError:
                continue
        return gone

    def touch(self, name: str) -> None:
        """Record that ``name`` was just used (for ``list``'s "last used"). Silent if it is not installed.

        Looked at first without the lock: nothing to do for a model not installed, nor within
        ``TOUCH_EVERY_S`` of the time recorded (``list`` shows it to the minute). The lock and the
        synced write cost ~15 ms at the end of a run; scripts run one after another."""
        try:
            entry = self.entry(name)
            if entry is None:
                return
            last = entry.get("last_used")
            if last:
                age = _dt.datetime.now(_dt.timezone.utc) - _dt.datetime.fromisoformat(last)
                if 0 <= age.total_seconds() < TOUCH_EVERY_S:
                    return
        except Exception:  # noqa: BLE001 - an unreadable manifest or time: the locked edit decides
            pass
        with self.edit() as models:
            if name in models:
                models[name]["last_used"] = now_iso()

    def load_path(self, entry: dict[str, Any]) -> Path:
        """The file llama.cpp should open for an entry (first shard for split models)."""
        load = entry["load"]
        return self.root / load if entry.get("kind") == "store" else Path(load)

    def file_paths(self, entry: dict[str, Any]) -> list[Path]:
        out = []
        for f in entry.get("files", []):
            out.append(self.blob_path(f["sha256"]) if entry.get("kind") == "store" else Path(f["path"]))
        return out

    # ---- digest cache -------------------------------------------------------------------------
    def _read_cache(self) -> dict[str, Any]:
        """The digest cache; an unreadable one is simply empty (it is only a cache)."""
        try:
            cache = read_json(self.verified_path, {})
        except (ValueError, UnicodeDecodeError, OSError):
            return {}
        return cache if isinstance(cache, dict) else {}

    def cached_digest(self, path: Path) -> str | None:
        """The sha256 recorded for ``path`` if its size, mtime, inode and device are unchanged since."""
        try:
            key = stat_key(path)
        except OSError:
            return None
        cache = self._read_cache()
        rec = cache.get(str(path))
        if not isinstance(rec, dict):
            return None
        if rec.get("boot") is not None and rec["boot"] != boot_id():
            return None  # written without fsync before a restart: maybe torn by a crash, hash it again
        if all(rec.get(k) == v for k, v in key.items()):
            digest = rec.get("sha256")
            return digest if isinstance(digest, str) else None
        return None

    def record_digest(self, path: Path, sha256: str, *, synced: bool = True) -> None:
        """Remember that ``path`` (as it is now) has ``sha256``. ``synced=False``: its bytes may still
        be only in the page cache (a download, not fsync'ed); the record then holds only until the
        machine restarts, and the first use after a restart hashes the file again."""
        try:
            key = stat_key(path)
        except OSError:
            return
        record: dict[str, Any] = {**key, "sha256": sha256}
        if not synced:
            record["boot"] = boot_id()
        with file_lock(self.lock_path("verified")):
            cache = self._read_cache()
            # Drop records of files that are gone, so the cache does not grow without bound.
            cache = {p: r for p, r in cache.items() if os.path.exists(p)}
            cache[str(path)] = record
            atomic_write_json(self.verified_path, cache)

    def forget_digest(self, path: Path) -> None:
        with file_lock(self.lock_path("verified")):
            cache = self._read_cache()
            if cache.pop(str(path), None) is not None:
                atomic_write_json(self.verified_path, cache)


def header_summary(info: Any) -> dict[str, Any]:
    """What ``list``/``show`` display about a GGUF, cached in the manifest so listing reads no model file."""
    template = getattr(info, "chat_template", None)
    return {
        "architecture": getattr(info, "architecture", None),
        "model_name": getattr(info, "name", None),
        "parameter_count": getattr(info, "parameter_count", None),
        "context_length": getattr(info, "context_length", None),
        "block_count": getattr(info, "block_count", None),
        "quantization": getattr(info, "quantization", None),
        "file_type": _plain(getattr(info, "file_type", None)),
        "license": getattr(info, "license", None),
        "has_chat_template": bool(template),
        "split_count": getattr(info, "split_count", None),
        "gguf_version": getattr(info, "version", None),
    }


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
