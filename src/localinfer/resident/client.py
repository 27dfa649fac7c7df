"""Find the resident server (or start it, once, under a lock) and talk to it over its Unix socket.

The HTTP is a few lines of HTTP/1.1 on an AF_UNIX socket and the stream is read by our remote
client's ``StreamState``: the same OpenAI protocol as ``--endpoint``, without importing httpx, so a
command whose model is resident sends its request before ``--help`` would have printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from collections.abc import Iterator
from typing import Any

from localinfer.errors import Interrupted, LocalInferError
from localinfer.remote.client import OnText, Received, StreamState
from localinfer.remote.connection import Endpoint, RemoteError, status_error
from localinfer.resident import start
from localinfer.resident.start import Place

START_TIMEOUT_S = 60.0  # a fresh interpreter importing the server's packages on a loaded machine
_HOST = "localhost"  # what the Host header says: the serve app's guard answers localhost


def own_error(err: Any, default: type[LocalInferError], message: str) -> LocalInferError:
    """Our error as the server wrote it (``{"type", "message", "hint"}``), rebuilt as the same
    exception here (the same message, hint and exit code as if it had been raised here)."""
    from localinfer import errors

    err = err if isinstance(err, dict) else {}
    kind = getattr(errors, str(err.get("type")), None)
    if not (isinstance(kind, type) and issubclass(kind, LocalInferError)):
        kind = default
    return kind(str(err.get("message") or message), hint=err.get("hint"))


class NoServer(Exception):
    """Nothing listens on the socket (no file, or a stale one left by a crashed server)."""


class _Response:
    """One HTTP/1.1 response read off the socket: status, headers, then the body (sized or chunked)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.file = sock, sock.makefile("rb")
        status_line = self.file.readline(65536)
        if not status_line:
            raise ConnectionResetError("the server closed the connection without answering")
        self.status = int(status_line.split(b" ", 2)[1])
        self.headers: dict[str, str] = {}  # names lower-cased as read; looked up in lower case
        while (line := self.file.readline(65536)) not in (b"\r\n", b"\n", b""):
            key, _, value = line.decode("latin-1").partition(":")
            self.headers[key.strip().lower()] = value.strip()
        self.chunked = self.headers.get("transfer-encoding", "").lower() == "chunked"
        self.left = int(self.headers["content-length"]) if "content-length" in self.headers else None

    def lines(self) -> Iterator[bytes]:
        """The body's lines as they arrive (SSE), to its end."""
        if not self.chunked:
            while self.left is None or self.left > 0:
                line = self.file.readline(1 << 20 if self.left is None else min(self.left, 1 << 20))
                if not line:
                    break
                if self.left is not None:
                    self.left -= len(line)
                yield line
            return
        carry = b""
        while True:
            size = int(self.file.readline(1024).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                self.file.readline(1024)
                break
            data = self.file.read(size + 2)
            if len(data) < size + 2:
                raise ConnectionResetError("the stream was cut in the middle of a chunk")
            *complete, carry = (carry + data[:-2]).split(b"\n")
            for line in complete:
                yield line + b"\n"
        if carry:
            yield carry

    def read(self) -> bytes:
        return b"".join(self.lines())

    def close(self) -> None:
        self.file.close()
        self.sock.close()


class UnixClient:
    """Requests to the resident server: management calls (:meth:`call`) and streamed completions for
    the model whose route is ``prefix`` (:meth:`stream`, as ``remote.client.Client.stream``).
    One connection per request (a Unix socket connects in microseconds): thread-safe as it is."""

    def __init__(self, path: Path, *, timeout_s: float = 600.0, prefix: str = "") -> None:
        self.path, self.timeout_s, self.prefix = path, timeout_s, prefix
        self.ep = Endpoint(f"http://{_HOST}{prefix}/v1", None, timeout_s)

    def route(self, prefix: str) -> UnixClient:
        """A client for one model's routes (``/m/ID/v1``)."""
        return UnixClient(self.path, timeout_s=self.timeout_s, prefix=prefix)

    def close(self) -> None:
        pass

    def _send(self, method: str, path: str, body: Any | None) -> _Response:
        data = b"" if body is None else json.dumps(body).encode()
        head = (f"{method} {path} HTTP/1.1\r\nHost: {_HOST}\r\nAccept: text/event-stream, application/json\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n")  # fmt: skip
        with refusals():
            sock = start.connect(self.path, self.timeout_s)  # the folder and the listening process checked
        if sock is None:
            raise NoServer()
        try:
            sock.sendall(head.encode("latin-1") + data)
            return _Response(sock)
        except (OSError, ValueError, IndexError) as exc:
            sock.close()
            raise RemoteError(f"the resident server at {self.path} did not answer: {exc or type(exc).__name__}",
                              retryable=True) from None  # fmt: skip

    def call(self, method: str, path: str, body: Any | None = None) -> tuple[int, Any]:
        """One JSON request and its JSON answer (status, body)."""
        r = self._send(method, path, body)
        try:
            data = r.read()
        except (OSError, ValueError) as exc:
            raise RemoteError(f"the resident server at {self.path} broke the connection: {exc}", retryable=True) from None
        finally:
            r.close()
        try:
            return r.status, json.loads(data) if data else None
        except ValueError:
            raise RemoteError(f"the resident server sent a body that is not JSON ({r.status})") from None

    # -- what RemoteBackend calls -------------------------------------------------------------------
    def models(self) -> list[str]:
        status, body = self.call("GET", f"{self.prefix}/v1/models")
        if status != 200:
            raise status_error(status, json.dumps(body).encode(), {}, self.ep, "the model list")
        return [m["id"] for m in body.get("data", ())]

    def pick_model(self, name: str | None) -> str:
        return name or self.models()[0]

    def stream(self, body: dict[str, Any], on_text: OnText | None = None, on_reasoning: OnText | None = None) -> Received:
        path = f"{self.prefix}/v1/" + ("chat/completions" if "messages" in body else "completions")
        t0 = time.perf_counter()
        state = StreamState(self.ep.display, t0, on_text, on_reasoning)
        try:
            r = self._send("POST", path, body)
        except NoServer:
            raise RemoteError(f"the resident server at {self.path} is gone", retryable=True) from None
        try:
            if r.status != 200:
                body = r.read()
                raise _answer_error(body) or status_error(r.status, body, r.headers, self.ep)
            if r.headers.get("content-type", "").startswith("application/json"):
                state.whole(json.loads(r.read()), time.perf_counter())
            else:
                for line in r.lines():
                    state.line(line.rstrip(b"\r\n").decode("utf-8", errors="replace"), time.perf_counter())
        except KeyboardInterrupt as exc:
            raise Interrupted(state.interrupted(time.perf_counter())) from exc
        except (OSError, ValueError) as exc:
            raise RemoteError(f"the connection to the resident server broke during the answer: {exc or type(exc).__name__}",
                              retryable=True) from None  # fmt: skip
        finally:
            r.close()
        return state.finish(time.perf_counter())


def _answer_error(body: bytes) -> LocalInferError | None:
    """The error behind a refused request, when the server sent it whole (a context overflow)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    own = data.get("localinfer") if isinstance(data, dict) else None
    return own_error(own, LocalInferError, "the resident server refused the request") if isinstance(own, dict) else None


# -- finding or starting the server -------------------------------------------------------------------
@contextlib.contextmanager
def refusals() -> Iterator[None]:
    """A socket that is not ours alone (``start.Untrusted``) as the one-line error a command prints."""
    try:
        yield
    except start.Untrusted as exc:
        raise LocalInferError(str(exc), hint="another user (or sandbox) may be listening in your place; remove that "
                              "socket or folder, or set XDG_RUNTIME_DIR (see docs/security.md)") from None  # fmt: skip


def find(place: Place) -> UnixClient | None:
    """The running server's client, or None when none runs (never starts one: ``ps``, ``stop``)."""
    try:
        with refusals():
            return UnixClient(place.socket) if start.alive(place.socket) else None
    except OSError:
        return None


def find_or_start(place: Place, *, max_models: int | None = None, preload: dict[str, Any] | None = None,
                  timeout_s: float = START_TIMEOUT_S) -> UnixClient:
    """The server's client, starting the server first when none runs. Two commands starting at once
    start one: the starter holds ``place.lock`` (flock) until the new server serves (it says so on
    a pipe: no polling). ``preload``: the load request a new server starts on at once (its model
    loads while the server imports the rest). OSError: the folder or socket cannot be made (the
    caller then runs locally)."""
    with refusals():
        if start.alive(place.socket):
            return UnixClient(place.socket)
        with start.locked(place):
            started = start.start(place, max_models=max_models, preload=preload)
            if started is not None:
                _wait_ready(place, started, timeout_s)
    return UnixClient(place.socket)


def _wait_ready(place: Place, started: start.Started, timeout_s: float) -> None:
    import select

    try:
        readable, _, _ = select.select([started.ready], [], [], timeout_s)
        said = os.read(started.ready, 1) if readable else None
    finally:
        os.close(started.ready)
    if said is None:
        raise LocalInferError(f"the resident server did not start within {timeout_s:g} s", hint=f"see {place.log}")
    if not said:  # EOF: it exited before serving
        status = started.server.wait()
        raise LocalInferError(f"the resident server exited at start (status {status}): {_log_tail(place.log)}",
                              hint=f"see {place.log}")  # fmt: skip


def _log_tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1] if lines else "no log"
