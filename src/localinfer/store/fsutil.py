"""Small file-system helpers: atomic writes, hashing, locks, human sizes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from localinfer.units import human_bytes as human_size

HASH_BLOCK = 4 * 1024 * 1024


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (best effort; not every platform can open a directory)."""
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_json(path: Path, data: object, *, sort_keys: bool = True) -> None:
    """Write JSON to ``path`` so readers see the old or the new content, never a mix: tmp + fsync + replace.
    ``sort_keys=False``: objects keep their keys' order (it may carry meaning)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=sort_keys)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def read_json(path: Path, default: object) -> object:
    try:
        with path.open("r", encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return default


def sha256_file(path: Path, progress: Callable[[int], None] | None = None, *, limit: int | None = None) -> str:
    """sha256 of a file (or of its first ``limit`` bytes), reading in large blocks."""
    digest = hashlib.sha256()
    remaining = limit
    with path.open("rb", buffering=0) as fh:
        buf = bytearray(HASH_BLOCK)
        view = memoryview(buf)
        while remaining is None or remaining > 0:
            want = HASH_BLOCK if remaining is None else min(HASH_BLOCK, remaining)
            n = fh.readinto(view[:want])
            if not n:
                break
            digest.update(view[:n])
            if remaining is not None:
                remaining -= n
            if progress is not None:
                progress(n)
    return digest.hexdigest()


def hash_prefix(path: Path, nbytes: int) -> "hashlib._Hash":
    """A sha256 object already fed with the first ``nbytes`` of ``path`` (to resume hashing a partial file)."""
    digest = hashlib.sha256()
    remaining = nbytes
    with path.open("rb", buffering=0) as fh:
        buf = bytearray(HASH_BLOCK)
        view = memoryview(buf)
        while remaining > 0:
            n = fh.readinto(view[: min(HASH_BLOCK, remaining)])
            if not n:
                break
            digest.update(view[:n])
            remaining -= n
    return digest


def stat_key(path: Path) -> dict[str, int]:
    """What identifies a file's bytes cheaply: size, mtime in ns, inode (and device)."""
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino, "dev": st.st_dev}


@contextlib.contextmanager
def file_lock(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """An inter-process lock on ``path`` (created if needed); ``on_wait`` is called once if we must wait."""
    import filelock

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        if on_wait is not None:
            on_wait()
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def try_file_lock(path: Path) -> Iterator[bool]:
    """Like ``file_lock``, but never waits: yields False (and holds nothing) when another holds it."""
    import filelock

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


def human_count(n: int | None) -> str:
    if not n:
        return "-"
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f}{unit}" if value < 100 else f"{value:.0f}{unit}"
    return str(n)
