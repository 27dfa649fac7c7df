"""Talking to the Hugging Face Hub through ``huggingface_hub`` (imported only here, only when called).

Environment read at call time (not at import): ``HF_ENDPOINT``, ``HF_TOKEN`` (via
``huggingface_hub.get_token``, also the stored login), ``HF_HUB_OFFLINE``, ``HF_HUB_DOWNLOAD_TIMEOUT``.
The token is sent to the Hub only, never printed or logged by us.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlparse

from localinfer.errors import LocalInferError, ModelNotFoundError, NetworkError, ResourceError
from localinfer.store.fsutil import hash_prefix
from localinfer.store.types import NullProgress, ProgressSink

DEFAULT_ENDPOINT = "https://huggingface.co"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
TRANSIENT_STATUS = (408, 429, 500, 502, 503, 504)
MAX_RETRIES = 5  # consecutive failed attempts (without a single new byte) before giving up


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def token() -> str | None:
    from huggingface_hub import get_token

    return get_token()


def _token_hint() -> str:
    have = bool(os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN"))
    if have:
        return "HF_TOKEN is set but was refused: check that this token has access to the repository (accept its license on the model page)"
    return "this repository needs authentication: accept its license on the model page, then set HF_TOKEN to a token with read access"


@dataclass(frozen=True)
class RemoteFile:
    filename: str
    size: int | None
    sha256: str | None  # the LFS oid when the Hub gave it


@dataclass(frozen=True)
class RepoListing:
    repo: str
    commit: str  # the commit the listing (and then every download) refers to
    files: dict[str, RemoteFile]


@contextlib.contextmanager
def hub_errors(repo: str, filename: str | None = None) -> Iterator[None]:
    """Translate ``huggingface_hub`` / ``httpx2`` failures into our errors (and exit codes)."""
    import httpx2
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    what = f"{repo}/{filename}" if filename else repo
    try:
        yield
    except LocalInferError:
        raise
    except GatedRepoError as exc:
        status = exc.response.status_code if exc.response is not None else "401/403"
        raise NetworkError(f"access to the gated repository {repo} was refused (HTTP {status})", hint=_token_hint()) from None
    except RepositoryNotFoundError:
        raise ModelNotFoundError(
            f"repository {repo} not found on the Hub ({endpoint()})",
            hint="check the name; if the repository is private, set HF_TOKEN to a token that can read it",
        ) from None
    except RevisionNotFoundError:
        raise ModelNotFoundError(f"revision not found in {repo}", hint="check the @revision (branch, tag or commit)") from None
    except RemoteEntryNotFoundError:
        raise ModelNotFoundError(f"file not found on the Hub: {what}", hint=f"see the files at {endpoint()}/{repo}/tree/main") from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            raise NetworkError(f"the Hub refused access to {what} (HTTP {status})", hint=_token_hint()) from None
        raise NetworkError(f"the Hub answered HTTP {status} for {what}", hint="try again later") from None
    except OfflineModeIsEnabled:
        raise NetworkError("cannot reach the Hub: offline mode is on (HF_HUB_OFFLINE)", hint="unset HF_HUB_OFFLINE") from None
    except httpx2.TransportError as exc:
        raise NetworkError(
            f"cannot reach the Hub at {endpoint()}: {type(exc).__name__}",
            hint="check your connection (or HF_ENDPOINT); run the same command again to resume",
        ) from None


def list_repo(repo: str, revision: str | None) -> RepoListing:
    """The repository's files with sizes and LFS sha256, at ``revision`` (resolved to a commit)."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint(), token=token() or False)
    with hub_errors(repo):
        info = api.model_info(repo, revision=revision, files_metadata=True, timeout=_timeout())
    files: dict[str, RemoteFile] = {}
    for sib in info.siblings or []:
        lfs = sib.lfs
        sha = lfs.sha256 if lfs is not None else None
        size = lfs.size if lfs is not None else sib.size
        files[sib.rfilename] = RemoteFile(sib.rfilename, size, sha.lower() if isinstance(sha, str) else None)
    commit = info.sha or revision or "main"
    return RepoListing(repo=repo, commit=commit, files=files)


def hf_cache_dir() -> Path:
    """huggingface_hub's cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub), read now."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(os.path.expandvars(explicit)).expanduser()
    hf_home = os.environ.get("HF_HOME")
    if hf_home:
        return Path(os.path.expandvars(hf_home)).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def hf_cached_blob(repo: str, sha256: str, size: int | None) -> Path | None:
    """A file huggingface_hub already downloaded with this sha256 (its cache names LFS blobs by sha256)."""
    owner, name = repo.split("/", 1)
    path = hf_cache_dir() / f"models--{owner}--{name}" / "blobs" / sha256
    try:
        if path.is_file() and not path.is_symlink() and (size is None or path.stat().st_size == size):
            return path
    except OSError:
        return None
    return None


def file_url(repo: str, revision: str, filename: str) -> str:
    return f"{endpoint()}/{repo}/resolve/{quote(revision, safe='')}/{quote(filename)}"


@dataclass(frozen=True)
class FileMeta:
    url: str  # where to GET the bytes (after the Hub's redirect, e.g. a CDN)
    size: int | None
    etag: str | None
    commit: str | None
    send_auth: bool  # False when the bytes live on another host (a signed CDN URL)


def file_metadata(repo: str, revision: str, filename: str) -> FileMeta:
    """HEAD the file on the Hub: final location, size, etag (the sha256 for LFS files), commit."""
    from huggingface_hub import get_hf_file_metadata

    url = file_url(repo, revision, filename)
    with hub_errors(repo, filename):
        meta = get_hf_file_metadata(url, token=token() or False, timeout=_timeout(), endpoint=endpoint())
    location = meta.location or url
    same_host = urlparse(location).netloc == urlparse(url).netloc
    return FileMeta(url=location, size=meta.size, etag=meta.etag, commit=meta.commit_hash, send_auth=same_host)


def _timeout() -> float:
    try:
        return float(os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT") or 10)
    except ValueError:
        return 10.0


def etag_sha256(etag: str | None) -> str | None:
    return etag.lower() if etag and _SHA256.match(etag.lower()) else None


def download(
    meta: FileMeta,
    dest: Path,
    *,
    size: int | None,
    repo: str,
    filename: str,
    label: str,
    progress: ProgressSink | None = None,
) -> str:
    """Download ``meta.url`` into ``dest`` (a partial file), resuming from the bytes already in it.

    The sha256 is computed while writing (the bytes already on disk are hashed once, when resuming).
    Transient failures (connection cut, timeout, 5xx) are retried with a Range request from the last
    byte written; a server that ignores Range (200 instead of 206) makes us start over cleanly.
    Returns the hex digest of the complete file. The partial file is left in place on any failure so
    the next pull resumes it.
    """
    import httpx2
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    sink = progress or NullProgress()
    dest.parent.mkdir(parents=True, exist_ok=True)
    headers = build_hf_headers(token=(token() or False) if meta.send_auth else False)
    headers["Accept-Encoding"] = "identity"
    fd = os.open(str(dest), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    with os.fdopen(fd, "r+b", buffering=0) as fh:
        have = fh.seek(0, os.SEEK_END)
        if size is not None and have > size:
            fh.truncate(0)
            have = fh.seek(0)
        digest = _BackgroundHash(hash_prefix(dest, have) if have else None)
        sink.start(label, size, have)
        failures = 0
        try:
            while size is None or have < size:
                req = dict(headers)
                if have:
                    req["Range"] = f"bytes={have}-"
                got_bytes = False
                try:
                    with get_session().stream("GET", meta.url, headers=req, timeout=_timeout(), follow_redirects=True) as resp:
                        if resp.status_code in TRANSIENT_STATUS:
                            raise _Transient(f"HTTP {resp.status_code}")
                        if resp.status_code == 416 and size is not None and have >= size:
                            break
                        with hub_errors(repo, filename):
                            hf_raise_for_status(resp)
                        if have and resp.status_code == 200:
                            # Range ignored: the body is the whole file. Start over, cleanly.
                            sink.note(f"{filename}: the server ignored the resume request, downloading from the start")
                            fh.seek(0)
                            fh.truncate(0)
                            have = 0
                            digest.restart()
                            sink.reset(0)
                        elif have and resp.status_code == 206:
                            start = _content_range_start(resp.headers.get("Content-Range"))
                            if start != have:
                                raise NetworkError(
                                    f"the server resumed {filename} at byte {start}, not {have}",
                                    hint="run the same command again",
                                )
                        if size is None:
                            size = _total_from(resp) or None
                        for chunk in resp.iter_raw():
                            if size is not None and have + len(chunk) > size:
                                raise NetworkError(
                                    f"the server sent more than the {size} bytes announced for {filename}",
                                    hint="run the same command again",
                                )
                            _write_all(fh, chunk)
                            digest.update(chunk)
                            have += len(chunk)
                            got_bytes = True
                            sink.advance(len(chunk))
                    if size is None:
                        break
                    if have < size:
                        raise _Transient(f"the connection closed after {have} of {size} bytes")
                except (httpx2.TransportError, _Transient) as exc:
                    failures = 0 if got_bytes else failures + 1
                    if failures > MAX_RETRIES:
                        raise NetworkError(
                            f"downloading {filename} failed after {MAX_RETRIES} retries at {have} of {size} bytes ({_describe(exc)})",
                            hint="run the same command again: it resumes where it stopped",
                        ) from None
                    sink.note(f"{filename}: {_describe(exc)}; resuming at byte {have}")
                    time.sleep(min(0.25 * 2 ** max(failures - 1, 0), 4.0))
            os.fsync(fh.fileno())
            return digest.hexdigest()
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise ResourceError(
                    f"the disk filled up while downloading {filename} ({have} bytes written to {dest})",
                    hint="free some space and run the same command again: it resumes where it stopped",
                ) from None
            raise
        finally:
            digest.close()
            sink.finish()


class _Transient(Exception):
    pass


def _write_all(fh, data: bytes) -> None:  # noqa: ANN001
    view = memoryview(data)
    while view:
        n = fh.write(view)
        view = view[n:]


class _BackgroundHash:
    """sha256 computed on a helper thread, so hashing overlaps receiving and writing.

    ``hashlib`` releases the GIL while it hashes large buffers, so on a multi-core machine the digest
    costs (almost) no wall time; chunks are handed over in order through a bounded queue.
    """

    def __init__(self, start=None) -> None:  # noqa: ANN001 - hashlib's type is private
        import queue
        import threading

        self._digest = start if start is not None else _new_hash()
        self._queue: queue.Queue = queue.Queue(maxsize=64)
        self._thread = threading.Thread(target=self._run, name="localinfer-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        get, update = self._queue.get, self._digest.update
        while True:
            chunk = get()
            if chunk is None:
                return
            update(chunk)

    def update(self, chunk: bytes) -> None:
        self._queue.put(chunk)

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def hexdigest(self) -> str:
        self.close()
        return self._digest.hexdigest()

    def restart(self) -> None:
        """Forget everything hashed so far (the download starts again from byte 0)."""
        self.close()
        self.__init__()  # type: ignore[misc]


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text and not isinstance(exc, _Transient) else (text or type(exc).__name__)


def _new_hash():  # noqa: ANN202 - hashlib's type is private
    import hashlib

    return hashlib.sha256()


def _content_range_start(value: str | None) -> int | None:
    m = re.match(r"^\s*bytes\s+(\d+)-\d+/(\d+|\*)\s*$", value or "")
    return int(m.group(1)) if m else None


def _total_from(resp) -> int | None:  # noqa: ANN001
    cr = resp.headers.get("Content-Range")
    if cr and "/" in cr:
        tail = cr.rsplit("/", 1)[1]
        return int(tail) if tail.isdigit() else None
    cl = resp.headers.get("Content-Length")
    return int(cl) if cl and cl.isdigit() else None
