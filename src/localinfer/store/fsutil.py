"""Small file-system helpers: atomic writes, hashing, locks, human sizes.

Files the store writes in place (partial downloads, locks) are opened with :func:`open_in_store`,
never through a link someone planted there: that would write outside the store.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from localinfer.units import human_bytes as human_size  # noqa: F401 - re-exported for the CLI

fcntl: ModuleType | None
try:
    import fcntl as _fcntl

    fcntl = _fcntl
except ImportError:  # Windows
    fcntl = None

if TYPE_CHECKING:  # hashlib and tempfile are imported where used: a run that writes or hashes nothing
    import hashlib  # loads neither OpenSSL nor tempfile's random (a few ms of every start)

HASH_BLOCK = 4 * 1024 * 1024
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # absent on Windows: an lstat check stands in for it


def open_in_store(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` (created if missing) of a file the store owns, never through a link.

    A symlink at ``path``, or anything but a plain file with one name (a hard link to a file
    elsewhere, a fifo), is removed and a new file is created in its place.
    """
    flags |= os.O_CREAT | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    for _attempt in range(3):
        if not _NOFOLLOW and os.path.islink(path):
            os.unlink(path)
        try:
            fd = os.open(str(path), flags, mode)
        except OSError:
            if not os.path.islink(path):  # O_NOFOLLOW refused a link (ELOOP, EMLINK on BSD); else a real error
                raise
            os.unlink(path)
            continue
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            return fd
        os.close(fd)
        os.unlink(path)
    raise OSError(f"cannot create a plain file at {path}: something keeps replacing it")


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
    import tempfile

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
    import hashlib

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


def hash_prefix(fd: int, nbytes: int) -> "hashlib._Hash":
    """A sha256 object already fed with the first ``nbytes`` of the open file ``fd`` (to resume hashing a
    partial file); read through the descriptor, not the path, which could be swapped for a link meanwhile."""
    import hashlib

    digest = hashlib.sha256()
    remaining = nbytes
    os.lseek(fd, 0, os.SEEK_SET)
    with open(fd, "rb", buffering=0, closefd=False) as fh:
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


def _lock(path: Path, wait: bool) -> Callable[[], None] | None:
    """Take the inter-process lock on ``path``: its release function, or None if another holds it and
    not ``wait``. POSIX: ``flock`` on our own descriptor (filelock 3.x opens the path with O_TRUNC
    through a link planted there, 4.x fails on it); Windows has no flock: filelock, once the path is checked."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_in_store(path, os.O_RDWR)
    if fcntl is None:
        import filelock

        os.close(fd)
        lock = filelock.FileLock(str(path))
        try:
            lock.acquire(timeout=-1 if wait else 0)
        except filelock.Timeout:
            return None
        return lock.release
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return lambda: os.close(fd)  # closing the descriptor releases the lock


@contextlib.contextmanager
def file_lock(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """An inter-process lock on ``path`` (created if needed); ``on_wait`` is called once if we must wait."""
    release = _lock(path, wait=False)
    if release is None:
        if on_wait is not None:
            on_wait()
        release = _lock(path, wait=True)
    assert release is not None
    try:
        yield
    finally:
        release()


@contextlib.contextmanager
def try_file_lock(path: Path) -> Iterator[bool]:
    """Like ``file_lock``, but never waits: yields False (and holds nothing) when another holds it."""
    release = _lock(path, wait=False)
    if release is None:
        yield False
        return
    try:
        yield True
    finally:
        release()


def human_count(n: int | None) -> str:
    if not n:
        return "-"
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f}{unit}" if value < 100 else f"{value:.0f}{unit}"
    return str(n)
