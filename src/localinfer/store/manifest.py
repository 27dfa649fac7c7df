"""The store on disk: content-addressed blobs, partial downloads, locks and the manifest.

Layout under :func:`localinfer.paths.models_dir`::

    manifest.json          installed models (name -> entry), written atomically under manifest.lock
    verified.json          digest cache: path -> (size, mtime_ns, inode, dev, sha256)
    blobs/sha256-<hex>     verified model files, named by their content
    partial/sha256-<hex>.part   downloads in progress (resumed by the next pull)
    links/<hex>/<name>     split models: shard names llama.cpp needs, hard-linked to the blobs
    locks/                 per-file locks so two pulls of the same bytes do not collide

A model is in the manifest only once every one of its files is complete, verified and in place.
The manifest is checked when read (:func:`entry_problem`): an entry we do not understand is reported
and skipped, and kept as it is when the manifest is written; a manifest whose shape we do not
understand is refused, copied aside, and never overwritten.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from localinfer.errors import LocalInferError
from localinfer.store.fsutil import atomic_write_json, file_lock, read_json, stat_key, try_file_lock
from localinfer.store.untrusted import is_sha256, is_size, projector_problem, shown

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


_LOCK_KEY = re.compile(r"[a-z0-9][a-z0-9-]{0,99}")
_KINDS = ("store", "package", "local")
_OPTIONAL_TEXT = ("chat_format", "quant", "last_used", "added_at", "repo", "revision", "commit")
_warned: set[str] = set()


class _Gone(Exception):
    pass


def _digest(sha256: str) -> str:
    """``sha256`` if it is one: it names a file in the store, so nothing else may (callers check first)."""
    if not is_sha256(sha256):
        raise ValueError(f"not a sha256 digest: '{shown(sha256)}'")
    return sha256


class Store:
    """Paths and manifest operations of one store root (``models_dir()`` unless given)."""

    def __init__(self, root: Path | None = None) -> None:
        if root is None:
            from localinfer.paths import models_dir

            root = models_dir()
        self.root = Path(root)
        # Entries of the last read that we could not understand: skipped, written back as they were.
        self.unreadable: dict[str, Any] = {}

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
        return self.blobs_dir / f"sha256-{_digest(sha256)}"

    def partial_path(self, sha256: str) -> Path:
        return self.partial_dir / f"sha256-{_digest(sha256)}.part"

    def lock_path(self, key: str) -> Path:
        if not _LOCK_KEY.fullmatch(key):
            raise ValueError(f"not a lock name: '{shown(key)}'")
        return self.locks_dir / f"{key}.lock"

    # ---- manifest -----------------------------------------------------------------------------
    def _read(self) -> dict[str, Any]:
        """The manifest with the entries we understand in ``models``; the others go to ``self.unreadable``."""
        try:
            data = read_json(self.manifest_path, None)
        except (ValueError, UnicodeDecodeError) as exc:
            raise self._refuse(f"is unreadable ({exc})") from None
        if data is None:
            data = {"version": MANIFEST_VERSION, "models": {}}
        if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
            raise self._refuse("does not hold a table of models")
        if data.get("version", MANIFEST_VERSION) != MANIFEST_VERSION:
            raise self._refuse(f"has version '{shown(data['version'])}', which this localinfer does not know")
        models: dict[str, Any] = {}
        self.unreadable = {}
        for name, entry in data["models"].items():
            problem = entry_problem(name, entry)
            if problem is None:
                models[name] = entry
                continue
            self.unreadable[name] = entry
            _warn_once(
                f"skipping the model '{shown(name)}' in {self.manifest_path}: {problem}; pull it again to "
                f"replace it, or 'localinfer rm {shown(name)}' to forget it"
            )
        data["models"] = models
        return data

    def _refuse(self, problem: str) -> LocalInferError:
        """The error for a manifest we cannot understand: it is left as it is, and a copy kept aside."""
        backup = self._back_up()
        kept = f"a copy is in {backup}; " if backup else ""
        return LocalInferError(
            f"the model manifest {self.manifest_path} {problem}; it was left untouched",
            hint=f"{kept}fix it, or move it aside and pull your models again (their files in the store are reused)",
        )

    def _back_up(self) -> Path | None:
        """A copy of the manifest, named by its content (one copy however often it is read); None if impossible."""
        try:
            raw = self.manifest_path.read_bytes()
            import hashlib

            backup = self.root / f"manifest.unreadable-{hashlib.sha256(raw).hexdigest()[:12]}.json"
            fd = os.open(str(backup), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # O_EXCL: no link followed
        except FileExistsError:
            return backup
        except OSError:
            return None
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        return backup

    def digests_in_use(self) -> set[str]:
        """The sha256 of every blob an installed model uses, and of any an entry we could not understand names."""
        used = {rec["sha256"] for e in self.entries().values() if e["kind"] == "store" for rec in e["files"]}
        used |= {e["mmproj"]["sha256"] for e in self.entries().values() if e["kind"] == "store" and e.get("mmproj")}
        return used | set(re.findall(r"[0-9a-f]{64}", json.dumps(self.unreadable)))

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
            data["models"] = {**self.unreadable, **models}  # never drop what we could not understand
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
            if not is_sha256(path.name.removeprefix("sha256-").removesuffix(".part")):
                continue  # not a download of ours
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
        except Exception:  # an unreadable manifest or time: the locked edit decides
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


def _size_or_none(value: Any) -> bool:
    return value is None or is_size(value)


def entry_problem(name: str, entry: Any) -> str | None:
    """What is wrong with a manifest entry, in a few words; None when every field we use has the shape
    we use it with (so that no command fails on it, nor names a file outside the store through it)."""
    if not isinstance(entry, dict):
        return f"its entry is not an object but a JSON {type(entry).__name__}"
    if entry.get("name") != name:
        return "its name is missing or does not match"
    kind = entry.get("kind")
    if kind not in _KINDS:
        return "unknown kind"
    if not isinstance(entry.get("source"), str) or not isinstance(entry.get("load"), str):
        return "no source or load path"
    load = Path(entry["load"])
    if kind == "store" and (load.is_absolute() or not load.parts or ".." in load.parts):
        return "its load path leaves the store"
    if not _size_or_none(entry.get("size")) or not isinstance(entry.get("header") or {}, dict):
        return "bad size or header"
    bad = [k for k in _OPTIONAL_TEXT if not isinstance(entry.get(k), (str, type(None)))]
    if bad:
        return f"bad {bad[0]}"
    files = entry.get("files")
    if not isinstance(files, list):
        return "no list of files"
    for rec in files:
        ok = isinstance(rec, dict) and is_sha256(rec.get("sha256")) and _size_or_none(rec.get("size"))
        ok = ok and isinstance(rec.get("filename"), str) and (kind == "store" or isinstance(rec.get("path"), str))
        if not ok:
            return "a file without a valid sha256, size, name or path"
    return projector_problem(entry.get("mmproj"))


def _warn_once(message: str) -> None:
    """One line on stderr, once per process: every command reads the manifest, not all have a progress sink."""
    if message not in _warned:
        _warned.add(message)
        sys.stderr.write(f"warning: {message}\n")
        sys.stderr.flush()


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
