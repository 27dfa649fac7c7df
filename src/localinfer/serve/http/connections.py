"""Connections bounded before a request is whole: uvicorn's httptools protocol with a cap on the
bytes of a request's head (431), deadlines for its head and its body (408), a cap on open
connections, where the one idle or still sending its head the longest makes room (else 503), and
optionally a check of who connects (403: the resident server's peers, ``resident.server``).

httptools joins the pieces of a header line with ``bytes +=``: one endless header grew the
buffer without limit, in quadratic time, on the event loop. Here a head is fed at most
``max_header_bytes`` at a time and refused past it. uvicorn's ``limit_concurrency`` is no help:
it counts connections that never sent a request, so they would turn ``/health`` away too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

FD_RESERVE = 64  # descriptors kept for the model, logs, the usage history and the listening socket


@dataclass(frozen=True)
class Limits:
    max_header_bytes: int = 32 * 1024  # request line and headers: nginx's default total is 4 x 8 KiB
    header_timeout_s: float = 10.0  # from the connection (or a request's first byte) to its blank line
    body_timeout_s: float = 60.0  # from the head to the last byte of the body (4 MiB at 0.5 Mbit/s)
    max_connections: int = 1024
    refused: Callable[[int], None] | None = None  # told the status of each answer given here (/metrics)
    admit: Callable[[asyncio.Transport], str | None] | None = None  # why a peer is refused (403), None to admit it


def raise_file_limit(wanted: int) -> int:
    """Lift the soft descriptor limit towards ``wanted`` (not past the hard one); the soft limit now."""
    try:
        import resource
    except ImportError:  # Windows: no such limit to lift
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # macOS refuses past OPEN_MAX: keep what we have
            pass
    return soft


def protocol_class(limits: Limits) -> type[HttpToolsProtocol]:
    """The protocol of one server; its connections share one register of those waiting."""
    return type("BoundedHttp", (BoundedHttp,), {"limits": limits, "waiting": {}})


class BoundedHttp(HttpToolsProtocol):
    limits: ClassVar[Limits]
    waiting: ClassVar[dict[BoundedHttp, None]]  # no request at the app: idle or sending a head, oldest first

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_pending = True  # the next bytes are a request's head
        self._head_bytes = 0
        self._deadline: asyncio.TimerHandle | None = None
        why = self.limits.admit(transport) if self.limits.admit is not None else None
        if why is not None:  # before a byte of its request is read
            self._answer(403, why, "forbidden")
            return
        if len(self.connections) > self.limits.max_connections and not self._make_room():
            self._answer(503, "too many connections: retry shortly", "too_many_connections")
            return
        self.waiting[self] = None
        self._arm(self.limits.header_timeout_s, 408)

    def connection_lost(self, exc: Exception | None) -> None:
        self.waiting.pop(self, None)
        self._disarm()
        super().connection_lost(exc)

    def _make_room(self) -> bool:
        for victim in self.waiting:  # the oldest first
            del self.waiting[victim]
            self.connections.discard(victim)  # counted out now: its connection_lost comes later
            victim._disarm()
            victim.transport.close()
            return True
        return False

    def data_received(self, data: bytes) -> None:
        limit = self.limits.max_header_bytes
        while data and not self.transport.is_closing():
            if not self._head_pending:  # a body: bounded by --max-body and uvicorn's flow control
                super().data_received(data)
                return
            if self._deadline is None:  # the first byte of a request on a kept-alive connection
                self._arm(self.limits.header_timeout_s, 408)
            piece, data = data[: limit - self._head_bytes], data[limit - self._head_bytes :]
            self._head_bytes += len(piece)
            super().data_received(piece)
            if self._head_pending and self._head_bytes >= limit and not self.transport.is_closing():
                self._answer(431, f"the request's head exceeds {limit} bytes", "headers_too_large")

    def on_headers_complete(self) -> None:
        self._head_pending, self._head_bytes = False, 0
        self.waiting.pop(self, None)
        self._arm(self.limits.body_timeout_s, None)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._head_pending = True
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.timeout_keep_alive_task is not None:  # idle now (uvicorn's keep-alive timer runs)
            self.waiting.pop(self, None)
            self.waiting[self] = None

    def _unsupported_upgrade_warning(self) -> None:
        """An ``Upgrade`` we do not speak is answered as plain HTTP; uvicorn logged two warnings each."""

    def _arm(self, seconds: float, status: int | None) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired, status)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, status: int | None) -> None:
        self._deadline = None
        if status is not None and self._head_bytes:  # a head begun and not finished: say so
            self._answer(status, "the request's head did not arrive in time", "request_timeout")
        elif not self.transport.is_closing():
            self.transport.close()

    def _answer(self, status: int, message: str, code: str) -> None:
        """An error answer before any app saw the request, then the connection closes."""
        self.waiting.pop(self, None)
        self._disarm()
        if self.limits.refused is not None:
            self.limits.refused(status)
        if self.cycle is None or self.cycle.response_complete:  # else it would land inside that answer
            body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}).encode()
            head = b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body)
            self.transport.write(STATUS_LINE[status] + head + body)
        self.transport.close()
