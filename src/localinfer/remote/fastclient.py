"""A lean HTTP/1.1 client on asyncio streams, for the load generator on plain ``http://``.

Why: the load test must not be its own bottleneck, and httpx costs milliseconds of CPU per request
(its pool scans every connection per request); this costs a fraction of that, so a 2-core machine
drives a few hundred requests per second and timestamps each chunk as it arrives
(benchmarks/results/loadgen-2026-12-01.txt). It speaks only what a completion needs: one POST,
keep-alive, chunked or sized bodies. HTTPS and proxies go through httpx (``remote.client.astream``);
:func:`usable` says which.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from localinfer.remote.client import Received, StreamState
from localinfer.remote.connection import RemoteError, status_error

if TYPE_CHECKING:
    from localinfer.remote.connection import Endpoint

_timeout = getattr(asyncio, "timeout", None)


def usable(ep: Endpoint) -> bool:
    """Plain http with no proxy for this host (httpx handles the rest, as it handles them everywhere)."""
    parts = urlsplit(ep.base_url)
    if parts.scheme != "http" or os.environ.get("LOCALINFER_LOADGEN_HTTPX"):
        return False
    proxies = urllib.request.getproxies()
    return not (proxies.get("http") or proxies.get("all")) or urllib.request.proxy_bypass(parts.hostname or "")


class Pool:
    """Idle keep-alive connections to one server; at most ``limit`` open at once is the caller's job."""

    def __init__(self, ep: Endpoint) -> None:
        parts = urlsplit(ep.base_url)
        self.ep = ep
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.prefix = parts.path.rstrip("/")
        extra = "".join(f"{k}: {v}\r\n" for k, v in ep.headers().items())
        self._head = f"Host: {parts.netloc}\r\nContent-Type: application/json\r\n{extra}"
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def close(self) -> None:
        for _, w in self._idle:
            w.close()
        self._idle.clear()

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        while self._idle:
            r, w = self._idle.pop()
            if not w.is_closing() and not r.at_eof():
                return r, w, True
            w.close()
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(self.host, self.port, limit=1 << 20), min(10.0, self.ep.timeout_s))
        except (OSError, asyncio.TimeoutError) as exc:
            raise RemoteError(f"cannot connect to {self.ep.display}: {exc or type(exc).__name__}", retryable=True,
                              hint="is the server running? check --endpoint (or LOCALINFER_ENDPOINT)") from None  # fmt: skip
        return r, w, False

    async def stream(self, body: dict[str, Any]) -> Received:
        """POST one streaming completion and read it to the end (one retry on a stale idle connection)."""
        path = self.prefix + ("/chat/completions" if "messages" in body else "/completions")
        data = json.dumps(body).encode()
        request = f"POST {path} HTTP/1.1\r\n{self._head}Content-Length: {len(data)}\r\n\r\n".encode() + data
        for attempt in (0, 1):
            r, w, reused = await self._connection()
            t0 = time.perf_counter()
            try:
                w.write(request)
                return await self._response(r, w, StreamState(self.ep.display, t0))
            except _Stale:
                w.close()
                if not reused or attempt:
                    raise RemoteError(f"{self.ep.display} closed the connection without answering", retryable=True) from None
        raise AssertionError("unreachable")

    async def _read(self, coro: Any) -> Any:
        try:
            if _timeout is None:  # Python 3.10
                return await asyncio.wait_for(coro, self.ep.timeout_s)
            async with _timeout(self.ep.timeout_s):  # no task per read, unlike wait_for: cheaper per chunk
                return await coro
        except asyncio.TimeoutError:
            raise RemoteError(f"{self.ep.display} sent nothing for {self.ep.timeout_s:g} s", retryable=True,
                              hint="the server is slow or stuck: raise --timeout, or check the server") from None  # fmt: skip

    async def _response(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, state: StreamState) -> Received:
        try:
            head = await self._read(r.readuntil(b"\r\n\r\n"))
        except (asyncio.IncompleteReadError, ConnectionError):
            raise _Stale() from None
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        # names lower-cased as read; looked up in lower case
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        try:
            if status != 200:
                raise status_error(status, await self._body(r, headers), headers, self.ep)
            if headers.get("content-type", "").startswith("application/json"):
                state.whole(json.loads(await self._body(r, headers)), time.perf_counter())
            else:
                await self._lines(r, headers, state)
        except (asyncio.IncompleteReadError, ConnectionError):
            w.close()
            return state.finish(time.perf_counter())  # cut short: finish() says so, unless the answer had ended
        except BaseException:
            w.close()
            raise
        framed = "content-length" in headers or headers.get("transfer-encoding", "").lower() == "chunked"
        if framed and headers.get("connection", "").lower() != "close":
            self._idle.append((r, w))
        else:
            w.close()
        return state.finish(time.perf_counter())

    async def _body(self, r: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while chunk := await self._chunk(r):
                parts.append(chunk)
            return b"".join(parts)
        if "content-length" in headers:
            return await self._read(r.readexactly(int(headers["content-length"])))
        return await self._read(r.read())

    async def _chunk(self, r: asyncio.StreamReader) -> bytes:
        size = int((await self._read(r.readuntil(b"\r\n"))).split(b";")[0], 16)
        data = await self._read(r.readexactly(size + 2))
        return data[:-2]

    async def _lines(self, r: asyncio.StreamReader, headers: dict[str, str], state: StreamState) -> None:
        """Feed the body's lines to ``state`` as each piece arrives, to the end of the body."""
        chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        left = int(headers["content-length"]) if not chunked and "content-length" in headers else None
        carry = b""
        while True:
            if chunked:
                data = await self._chunk(r)
            elif left is not None:
                data = await self._read(r.read(min(left, 65536))) if left else b""
                left -= len(data)
            else:
                data = await self._read(r.read(65536))
            now = time.perf_counter()
            if not data:
                break
            *complete, carry = (carry + data).split(b"\n")
            for line in complete:
                state.line(line.rstrip(b"\r").decode("utf-8", errors="replace"), now)
        if carry:
            state.line(carry.rstrip(b"\r").decode("utf-8", errors="replace"), time.perf_counter())
            state.line("", time.perf_counter())


class _Stale(Exception):
    """An idle connection the server had closed: send the request again on a new one."""
