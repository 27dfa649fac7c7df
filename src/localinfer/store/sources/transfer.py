"""The bytes of one file: an HTTP GET streamed into a partial file, resumed, retried, hashed as written.

huggingface_hub decides *what* to fetch (the URL after the Hub's redirect, size, sha256, the auth
and user-agent headers: ``hub.file_metadata`` / ``hub.request_headers``). This module only moves
the bytes, with the standard library: ``http.client``'s ``readinto`` fills reusable 256 KiB buffers
straight from the socket, ``os.write`` puts them in the file, and a second thread hashes them
(``hashlib`` releases the GIL), so receiving, writing and hashing overlap on two cores.
huggingface_hub's httpx stream copies every 64 KiB chunk several times and ran at 0.37x curl here;
this path runs at 0.95x curl with the sha256 included (``benchmarks/pull_vs_curl.py``).

The bytes are not fsync'ed (neither curl, huggingface_hub nor Ollama do): on a disk slower than the
network, waiting for them cost the download a third of its speed. Instead, the record that says
the file was verified (``Store.record_digest(synced=False)``) holds only until the machine restarts:
the first use after a restart (so after any crash) hashes the file again, and a torn file is
refused before llama.cpp ever sees it.

Proxies (``HTTPS_PROXY``/``NO_PROXY``...) and redirects are urllib's; the ``Authorization`` header
is never carried across a redirect.
"""

from __future__ import annotations

import errno
import os
import queue
import re
import threading
import time
from pathlib import Path

from localinfer.errors import NetworkError, ResourceError
from localinfer.store.fsutil import hash_prefix, open_in_store
from localinfer.store.types import NullProgress, ProgressSink
from localinfer.store.untrusted import shown

BUFFER = 256 * 1024  # one read; small enough to still be in cache when the hashing thread reads it
BUFFERS = 16  # buffers in flight between the reader and the hashing thread (4 MiB)
PROGRESS_EVERY = 4 * 1024 * 1024  # report to the progress sink after this many bytes or PROGRESS_SECONDS
PROGRESS_SECONDS = 0.1
TRANSIENT_STATUS = (408, 429, 500, 502, 503, 504)
MAX_RETRIES = 5  # consecutive failed attempts (none reaching further into the file) before giving up
_DIGITS = re.compile(r"[0-9]{1,19}")  # ASCII only: str.isdigit() accepts '²', which int() refuses


class Refused(Exception):
    """The server answered a final HTTP error status (not worth retrying)."""

    def __init__(self, status: int, content_range: str | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.content_range = content_range


def fetch(
    url: str,
    dest: Path,
    *,
    size: int | None,
    headers: dict[str, str],
    auth: str | None,
    timeout: float,
    what: str,
    label: str,
    progress: ProgressSink | None = None,
) -> str:
    """GET ``url`` into ``dest`` (a partial file), resuming from the bytes already in it.

    ``auth`` (an ``Authorization`` value) goes to ``url`` only, never to a host it redirects to.
    The sha256 is computed while writing (bytes already on disk are hashed once, when resuming).
    Transient failures (connection cut, timeout, 408/429/5xx) are retried with a Range request from
    the last byte written; a server that ignores Range (200 instead of 206) makes us start over
    cleanly. Returns the hex digest of the complete file; raises ``Refused`` for a final HTTP error.
    The partial file is left in place on any failure so the next pull resumes it.
    """
    sink = progress or NullProgress()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd = open_in_store(dest, os.O_RDWR)  # a link planted in partial/ is replaced, never written through
    hasher: _Hasher | None = None
    have = 0
    complete = False
    try:
        have = os.lseek(fd, 0, os.SEEK_END)
        if size is not None and have > size:
            os.ftruncate(fd, 0)
            have = 0
        hasher = _Hasher(hash_prefix(fd, have) if have else None)
        opener = _opener()
        sink.start(label, size, have)
        failures = 0
        # The furthest byte ever on disk: an attempt is progress only if it gets past it. A server
        # that ignores Range makes us start over; counting its bytes as new would retry forever.
        furthest = have
        ignored_range = False
        while size is None or have < size:
            try:
                resp = _open(opener, url, headers, auth, have, timeout)
            except Refused as exc:
                if exc.status == 416:  # nothing left at byte `have`: complete, or longer than the file
                    total = _unsatisfied_total(exc.content_range)
                    if total == have or (total is None and size is not None and have >= size):
                        break  # complete: the sha256 decides
                    sink.note(f"{what}: the partial download is longer than the file on the server; starting over")
                    have = _start_over(fd, hasher, sink)
                    failures += 1
                    if failures > MAX_RETRIES:
                        raise
                    continue
                if exc.status not in TRANSIENT_STATUS:
                    raise
                resp, reason = None, str(exc)
            except _Transient as exc:
                resp, reason = None, str(exc)
            if resp is not None:
                with resp:
                    if have and resp.status == 200:
                        # Range ignored: the body is the whole file. Start over, cleanly.
                        sink.note(f"{what}: the server ignored the resume request, downloading from the start")
                        have = _start_over(fd, hasher, sink)
                        ignored_range = True
                    elif have and _content_range_start(resp.headers.get("Content-Range")) != have:
                        raise NetworkError(
                            f"the server resumed {what} at the wrong byte (asked for {have})",
                            hint="run the same command again",
                        )
                    total = _total_from(resp.headers, have)
                    if size is None:
                        size = total
                    elif total is not None and total > size:
                        raise NetworkError(
                            f"the server sent more than the {size} bytes announced for {what}",
                            hint="run the same command again",
                        )
                    have, reason = _receive(resp, fd, have, size, hasher, sink)
                if size is None and reason is None:
                    break  # no length announced: the body ended where the server closed it
                if reason is None and have < size:
                    reason = f"the connection closed after {have} of {size} bytes"
            if reason is None:
                continue
            failures = 0 if have > furthest else failures + 1
            furthest = max(furthest, have)
            if failures > MAX_RETRIES and ignored_range:
                raise NetworkError(
                    f"downloading {what} failed after {MAX_RETRIES} retries: the server ignores resume requests "
                    f"and its answers stop short of the {size} bytes announced (at most {furthest}; {reason})",
                    hint="try again later, or from another mirror (HF_ENDPOINT)",
                )
            if failures > MAX_RETRIES:
                raise NetworkError(
                    f"downloading {what} failed after {MAX_RETRIES} retries at {have} of {size} bytes ({reason})",
                    hint="run the same command again: it resumes where it stopped",
                )
            sink.note(f"{what}: {reason}; resuming at byte {have}")
            time.sleep(min(0.25 * 2 ** max(failures - 1, 0), 4.0))
        digest = hasher.hexdigest()
        complete = True
        return digest
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _disk_full(what, fd, dest, size) from None
        raise
    finally:
        if hasher is not None:
            hasher.close()
        if not complete:
            _drop_if_empty(fd, dest)
        os.close(fd)
        sink.finish()


def _disk_full(what: str, fd: int, dest: Path, size: int | None) -> ResourceError:
    """The message counts what is on disk (the bytes of this attempt included), not what we had before it."""
    from localinfer.store.fsutil import human_size

    written = os.fstat(fd).st_size
    if not written:
        return ResourceError(
            f"the disk is full: not a byte of {what} could be written in {dest.parent}",
            hint="free some space and run the same command again",
        )
    of = f" of {human_size(size)}" if size else ""
    return ResourceError(
        f"the disk filled up while downloading {what}: {human_size(written)}{of} written to {dest}",
        hint="free some space and run the same command again: it resumes where it stopped",
    )


def _drop_if_empty(fd: int, dest: Path) -> None:
    """A failed download that wrote nothing leaves no partial file: there is nothing to resume."""
    try:
        if os.fstat(fd).st_size == 0:
            dest.unlink(missing_ok=True)
    except OSError:
        pass


def _start_over(fd: int, hasher: _Hasher, sink: ProgressSink) -> int:
    """Empty the partial file and forget what was hashed and shown: the download restarts at byte 0."""
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    hasher.restart()
    sink.reset(0)
    return 0


def _receive(resp, fd: int, have: int, size: int | None, hasher: _Hasher, sink: ProgressSink):
    """Copy the body into the file until it ends or breaks: (bytes now on disk, why it broke or None)."""
    from http.client import HTTPException

    unreported, reported_at = 0, time.monotonic()
    try:
        while size is None or have < size:
            buf = hasher.buffer()
            view = memoryview(buf)
            if size is not None and size - have < BUFFER:
                view = view[: size - have]
            try:
                n = resp.readinto(view)
            except (OSError, HTTPException) as exc:
                hasher.give_back(buf)
                return have, _describe(exc)
            if not n:
                hasher.give_back(buf)
                return have, None
            done = 0
            while done < n:
                done += os.write(fd, view[done:n])
            hasher.update(buf, n)
            have += n
            unreported += n
            if unreported >= PROGRESS_EVERY or time.monotonic() - reported_at >= PROGRESS_SECONDS:
                sink.advance(unreported)
                unreported, reported_at = 0, time.monotonic()
        return have, None
    finally:
        if unreported:
            sink.advance(unreported)


def _opener():
    """urllib's default handlers, proxies read from the environment now (not at first use, as urlopen does)."""
    import urllib.request

    return urllib.request.build_opener()


def _open(opener, url: str, headers: dict[str, str], auth: str | None, have: int, timeout: float):
    """Start the GET (from byte ``have``); final HTTP errors raise ``Refused``, network ones ``_Transient``."""
    import urllib.error
    import urllib.request
    from http.client import HTTPException

    req = urllib.request.Request(url, headers={**headers, "Accept-Encoding": "identity"})
    if auth:
        req.add_unredirected_header("Authorization", auth)  # urllib drops it when following a redirect
    if have:
        req.add_header("Range", f"bytes={have}-")
    try:
        return opener.open(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        content_range = exc.headers.get("Content-Range") if exc.headers is not None else None
        exc.close()
        raise Refused(exc.code, content_range) from None
    except urllib.error.URLError as exc:
        raise _Transient(_describe(exc.reason if isinstance(exc.reason, BaseException) else exc)) from None
    except (OSError, HTTPException) as exc:
        raise _Transient(_describe(exc)) from None


class _Transient(Exception):
    pass


class _Hasher:
    """sha256 on a helper thread, fed with buffers from a small pool that the reader fills in turn."""

    def __init__(self, start=None) -> None:  # hashlib's type is private
        self._start(start)

    def _start(self, start=None) -> None:
        import hashlib

        self._digest = start if start is not None else hashlib.sha256()
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(BUFFERS):
            self._free.put(bytearray(BUFFER))
        self._todo: queue.SimpleQueue[tuple[bytearray, int] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="localinfer-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        get, update, free = self._todo.get, self._digest.update, self._free.put
        while True:
            item = get()
            if item is None:
                return
            buf, n = item
            update(memoryview(buf)[:n])
            free(buf)

    def buffer(self) -> bytearray:
        """A buffer to read into (waits while all of them are queued for hashing)."""
        return self._free.get()

    def give_back(self, buf: bytearray) -> None:
        self._free.put(buf)

    def update(self, buf: bytearray, n: int) -> None:
        self._todo.put((buf, n))

    def close(self) -> None:
        if self._thread.is_alive():
            self._todo.put(None)
            self._thread.join()

    def hexdigest(self) -> str:
        self.close()
        return self._digest.hexdigest()

    def restart(self) -> None:
        """Forget everything hashed so far (the download starts again from byte 0)."""
        self.close()
        self._start()


def _describe(exc: object) -> str:
    """An exception as one line for the user; its text may come from the server (a status line), so escaped."""
    text = shown(str(exc).strip(), limit=200)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _content_range_start(value: str | None) -> int | None:
    m = re.fullmatch(r"\s*bytes\s+([0-9]+)-[0-9]+/([0-9]+|\*)\s*", value or "")
    return int(m.group(1)) if m else None


def _unsatisfied_total(value: str | None) -> int | None:
    """N from a 416's ``Content-Range: bytes */N``."""
    m = re.fullmatch(r"\s*bytes\s+\*/([0-9]+)\s*", value or "")
    return int(m.group(1)) if m else None


def _total_from(headers, have: int) -> int | None:
    """The whole file's size as this response announces it (Content-Range total, else offset + length)."""
    cr = headers.get("Content-Range")
    if cr and "/" in cr:
        tail = cr.rsplit("/", 1)[1].strip()
        return int(tail) if _DIGITS.fullmatch(tail) else None
    cl = (headers.get("Content-Length") or "").strip()
    return have + int(cl) if _DIGITS.fullmatch(cl) else None

