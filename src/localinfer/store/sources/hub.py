"""Talking to the Hugging Face Hub through ``huggingface_hub`` (imported only here, only when called).

Environment read at call time (not at import): ``HF_ENDPOINT``, ``HF_TOKEN`` (via
``huggingface_hub.get_token``, also the stored login), ``HF_HUB_OFFLINE``, ``HF_HUB_DOWNLOAD_TIMEOUT``.
The token is sent to the Hub only, never printed or logged by us.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlparse

from localinfer.errors import LocalInferError, ModelNotFoundError, NetworkError
from localinfer.store.types import ProgressSink
from localinfer.store.untrusted import REFUSED_HINT, is_commit, is_sha256, is_size, shown

DEFAULT_ENDPOINT = "https://huggingface.co"


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
        raise _file_not_found(repo, what) from None
    except HfHubHTTPError as exc:
        raise _refused(exc.response.status_code if exc.response is not None else None, what) from None
    except OfflineModeIsEnabled:
        raise NetworkError("cannot reach the Hub: offline mode is on (HF_HUB_OFFLINE)", hint="unset HF_HUB_OFFLINE") from None
    except httpx2.TransportError as exc:
        raise NetworkError(
            f"cannot reach the Hub at {endpoint()}: {type(exc).__name__}",
            hint="check your connection (or HF_ENDPOINT); run the same command again to resume",
        ) from None
    except httpx2.TooManyRedirects:
        raise NetworkError(f"the Hub redirected {what} too many times (a redirect loop)", hint=REFUSED_HINT) from None
    except (KeyError, TypeError, ValueError) as exc:  # huggingface_hub could not parse the answer
        message = f"the Hub's answer for {what} is malformed ({type(exc).__name__})"
        raise NetworkError(message, hint=REFUSED_HINT) from None


def _checked(repo: str, what: str, value: object, ok: Callable[[object], bool]) -> object:
    """``value`` if ``ok`` says it has the right shape; else the whole answer is refused."""
    if not ok(value):
        raise NetworkError(f"refusing the Hub's answer for {repo}: invalid {what} '{shown(value)}'", hint=REFUSED_HINT)
    return value


def _file_not_found(repo: str, what: str) -> ModelNotFoundError:
    return ModelNotFoundError(f"file not found on the Hub: {what}", hint=f"see the files at {endpoint()}/{repo}/tree/main")


def _refused(status: int | None, what: str) -> NetworkError:
    """Our error for a final HTTP error status from the Hub (401/403: a hint about the token)."""
    if status in (401, 403):
        return NetworkError(f"the Hub refused access to {what} (HTTP {status})", hint=_token_hint())
    return NetworkError(f"the Hub answered HTTP {status} for {what}", hint="try again later")


def list_repo(repo: str, revision: str | None) -> RepoListing:
    """The repository's GGUF files with sizes and LFS sha256, at ``revision`` (resolved to a commit).

    Every value used later (names, digests, sizes, the commit) is checked here, before any download:
    one malformed value refuses the whole listing. Other files are left out: their names are never used.
    """
    from localinfer.store.names import validate_hub_filename

    with hub_errors(repo):
        info = _model_info(repo, revision)
        siblings = list(info.siblings or [])
    commit = _checked(repo, "commit id", info.sha, is_commit) if info.sha is not None else revision or "main"
    files: dict[str, RemoteFile] = {}
    for sib in siblings:
        name = sib.rfilename
        if not isinstance(name, str) or not name.lower().endswith(".gguf"):
            continue
        validate_hub_filename(name, source="hub")
        lfs = sib.lfs
        sha = lfs.sha256 if lfs is not None else None
        size = lfs.size if lfs is not None else sib.size
        if sha is not None:
            sha = _checked(repo, f"sha256 for {name}", sha.lower() if isinstance(sha, str) else sha, is_sha256)
        if size is not None:
            _checked(repo, f"size for {name}", size, is_size)
        files[name] = RemoteFile(name, size, sha)
    return RepoListing(repo=repo, commit=str(commit), files=files)


LISTING_MAX_BYTES = 16 << 20  # a listing, as sent and as inflated: ~50,000 files, far beyond any model repo


def _model_info(repo: str, revision: str | None):  # huggingface_hub's ModelInfo
    """``HfApi.model_info(files_metadata=True)``, reading at most LISTING_MAX_BYTES of the answer,
    compressed or not (huggingface_hub reads and inflates it whole: a 1 MB gzip bomb took 2 GB)."""
    import httpx2
    from huggingface_hub.hf_api import ModelInfo
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    from localinfer.request.limits import loads

    url = f"{endpoint()}/api/models/{repo}"
    if revision is not None:
        url += f"/revision/{quote(revision, safe='')}"
    headers = {**build_hf_headers(token=token() or False), "Accept-Encoding": "gzip"}
    for attempt in (1, 2):
        try:
            with get_session().stream("GET", url, headers=headers, params={"blobs": True}, timeout=_timeout()) as resp:
                body = _bounded_body(resp, repo)
                if resp.status_code >= 400:  # huggingface_hub's errors, from the body we read (bounded)
                    kept = {k: v for k, v in resp.headers.items() if k.lower() not in ("content-encoding", "content-length")}
                    hf_raise_for_status(httpx2.Response(resp.status_code, headers=kept, content=body, request=resp.request))
            break
        except httpx2.RemoteProtocolError:
            # A kept-alive connection the server has since closed (huggingface_hub's session is shared
            # by the process): one more try, on a new connection, as huggingface_hub's own calls do.
            if attempt == 2:
                raise
    data = loads(body, f"the Hub's listing of {repo}")
    if not isinstance(data, dict):
        raise ValueError("not an object")
    return ModelInfo(**data)


def _bounded_body(resp, repo: str) -> bytes:  # an httpx2 streaming response
    """The body, inflated, or a NetworkError once it passes LISTING_MAX_BYTES sent or inflated."""
    import zlib

    encoding = (resp.headers.get("Content-Encoding") or "identity").strip().lower()
    if encoding not in ("identity", "gzip", "x-gzip", "deflate"):
        raise NetworkError(f"refusing the Hub's listing of {repo}: it is encoded as '{shown(encoding)}'", hint=REFUSED_HINT)
    inflate = None if encoding == "identity" else zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib header
    out, sent, limit = bytearray(), 0, LISTING_MAX_BYTES
    too_big = NetworkError(f"refusing the Hub's listing of {repo}: it is larger than {limit >> 20} MiB", hint=REFUSED_HINT)
    try:
        for chunk in resp.iter_raw():
            sent += len(chunk)
            if sent > limit:
                raise too_big
            if inflate is None:
                out += chunk
                continue
            out += inflate.decompress(chunk, limit + 1 - len(out))  # never more than the room left
            if len(out) > limit or inflate.unconsumed_tail:
                raise NetworkError(f"{too_big} once inflated", hint=REFUSED_HINT)
        if inflate is not None:
            out += inflate.flush()
    except zlib.error as exc:
        raise NetworkError(f"refusing the Hub's listing of {repo}: its {encoding} encoding is broken ({exc})", hint=REFUSED_HINT) from None
    return bytes(out)


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
    _checked(repo, f"download location for {filename}", location, lambda u: urlparse(u).scheme in ("http", "https"))
    if meta.size is not None:
        _checked(repo, f"size for {filename}", meta.size, is_size)
    if meta.commit_hash is not None:
        _checked(repo, f"commit id for {filename}", meta.commit_hash, is_commit)
    same_host = urlparse(location).netloc == urlparse(url).netloc
    return FileMeta(url=location, size=meta.size, etag=meta.etag, commit=meta.commit_hash, send_auth=same_host)


def _timeout() -> float:
    try:
        return float(os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT") or 10)
    except ValueError:
        return 10.0


def etag_sha256(etag: str | None) -> str | None:
    """The sha256 an ETag carries (LFS files); None for any other ETag (a git blob id, or garbage)."""
    return etag.lower() if isinstance(etag, str) and is_sha256(etag.lower()) else None


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
    """Download ``meta.url`` into ``dest`` (a partial file), resuming; returns the sha256 of the whole file.

    huggingface_hub builds the request headers (user agent, the token when the bytes live on the
    Hub itself); ``transfer.fetch`` moves the bytes (see there for why not huggingface_hub's stream).
    """
    from huggingface_hub.utils import build_hf_headers

    from localinfer.store.sources import transfer

    headers = build_hf_headers(token=(token() or False) if meta.send_auth else False)
    auth = headers.pop("authorization", None) or headers.pop("Authorization", None)
    try:
        return transfer.fetch(
            meta.url,
            dest,
            size=size,
            headers=headers,
            auth=auth,
            timeout=_timeout(),
            what=filename,
            label=label,
            progress=progress,
        )
    except transfer.Refused as exc:
        what = f"{repo}/{filename}"
        raise (_file_not_found(repo, what) if exc.status == 404 else _refused(exc.status, what)) from None
