"""What a web page or a hostile client can do to `serve`: the Host, Origin and Content-Type rules
(through the ASGI app); the connection bounds - head size, head and body deadlines, the cap on
connections -, quiet Upgrades and the count of every answer, over real sockets against uvicorn in
this process with a scripted engine; and the issue's floor against a real `serve` (slow)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httptools")

import uvicorn
from conftest import run_cli
from test_serve import HI, FakeEngine, _state, call

from localinfer.serve.http.app import ServerState, create_app
from localinfer.serve.scheduler.bridge import Hub
from localinfer.serve.config import ServeConfig
from localinfer.serve.http.connections import Limits, protocol_class
from localinfer.serve.http.server import listen

OK_BODY = {"prompt": "x"}


def _code(data: bytes) -> str:
    return json.loads(data)["error"]["code"]


# -- Host: a page whose DNS name was rebound to 127.0.0.1 sends its own name ------------------------------
@pytest.mark.parametrize("host", ["localhost", "localhost:8080", "LOCALHOST.:1", "127.0.0.1", "127.0.0.1:8080", "[::1]:8080",
                                  "[::1]", "192.168.1.5:8080", "10.0.0.1"])  # fmt: skip
def test_loopback_names_and_addresses_are_answered(host):
    assert call(_state(FakeEngine()), "GET", "/v1/models", headers={"Host": host})[0] == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "localhost.evil.example", "127.0.0.1.nip.io", "mybox.lan"])
def test_other_names_are_403_on_every_route(host):
    state = _state(FakeEngine())
    for method, path in (("GET", "/v1/models"), ("GET", "/health"), ("GET", "/metrics"), ("POST", "/v1/completions")):
        status, headers, data = call(state, method, path, OK_BODY, headers={"Host": host})
        assert status == 403 and _code(data) == "host_not_allowed", (method, path)
        assert "--allowed-host" in json.loads(data)["error"]["message"]
        assert not any(k.startswith("access-control") for k in headers)


def test_refusals_before_any_route_come_in_the_routes_own_error_shape():
    # ollama-python and the anthropic SDK read their own shapes; a refusal made by the guard must too
    state = _state(FakeEngine())
    evil = {"Host": "evil.example"}
    status, _, data = call(state, "POST", "/api/chat", {"model": "m"}, headers=evil)
    assert status == 403 and "--allowed-host" in json.loads(data)["error"]  # Ollama's: {"error": "..."}
    status, _, data = call(state, "POST", "/v1/messages", {"model": "m"}, headers=evil)
    body = json.loads(data)
    assert status == 403 and body["type"] == "error" and body["error"]["type"] == "permission_error"
    status, _, data = call(state, "POST", "/api/generate", raw=b"x", headers={"Content-Type": "text/plain"})
    assert status == 415 and "JSON" in json.loads(data)["error"]
    status, _, data = call(state, "GET", "/api/nothing")
    assert status == 404 and isinstance(json.loads(data)["error"], str)
    status, _, data = call(state, "GET", "/v1/messages/nothing")
    assert status == 404 and json.loads(data)["error"]["type"] == "not_found_error"
    assert _code(call(state, "GET", "/v1/nothing")[2]) == "not_found"  # OpenAI's shape elsewhere


def test_more_names_by_flag_by_host_and_any_with_a_key():
    named = _state(FakeEngine(), allowed_hosts=("mybox.lan",))
    assert call(named, "GET", "/v1/models", headers={"Host": "mybox.lan:8080"})[0] == 200
    assert call(named, "GET", "/v1/models", headers={"Host": "evil.example"})[0] == 403
    bound = _state(FakeEngine(), host="mybox.lan")  # --host names the machine: that name is answered
    assert call(bound, "GET", "/v1/models", headers={"Host": "MyBox.lan:80"})[0] == 200
    anything = _state(FakeEngine(), allowed_hosts=("*",))
    assert call(anything, "GET", "/v1/models", headers={"Host": "evil.example"})[0] == 200
    keyed = _state(FakeEngine(), api_key="k")  # a page cannot send the key: any Host, the key decides
    assert call(keyed, "GET", "/health", headers={"Host": "evil.example"})[0] == 200
    assert call(keyed, "GET", "/v1/models", headers={"Host": "evil.example"})[0] == 401
    assert call(keyed, "GET", "/v1/models", headers={"Host": "evil.example", "Authorization": "Bearer k"})[0] == 200


# -- Content-Type: what a page may POST cross-site without a preflight -------------------------------------
@pytest.mark.parametrize("ctype", ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", "application/jsonx"])  # fmt: skip
def test_a_post_body_that_is_not_declared_json_is_415_before_it_is_read(ctype):
    engine = FakeEngine()
    for path in ("/v1/completions", "/v1/chat/completions"):
        body = OK_BODY if path == "/v1/completions" else {"messages": HI}
        status, _, data = call(_state(engine), "POST", path, body, headers={"Content-Type": ctype})
        assert status == 415 and _code(data) == "unsupported_media_type"
        assert "application/json" in json.loads(data)["error"]["message"]


def test_a_post_without_content_type_is_json_unless_a_page_sent_it():
    # litellm posts to Ollama's API with no Content-Type; a browser's cross-site POST has an Origin
    page = "http://localhost:3000"
    state = _state(FakeEngine(), cors_origins=(page,))
    status, _, data = call(state, "POST", "/v1/completions", OK_BODY, headers={"Content-Type": None})
    assert status == 200 and json.loads(data)["choices"][0]["text"] == "Hello"
    status, _, data = call(state, "POST", "/v1/chat/completions", {"messages": HI}, headers={"Content-Type": None})
    assert status == 200 and json.loads(data)["choices"][0]["message"]["content"] == "Hello"
    status, headers, data = call(state, "POST", "/v1/completions", OK_BODY, headers={"Content-Type": None, "Origin": page})
    assert status == 415 and _code(data) == "unsupported_media_type" and headers["access-control-allow-origin"] == page
    status, _, data = call(state, "POST", "/v1/completions", raw=b"not json", headers={"Content-Type": None})
    assert status == 400  # read as JSON: a bad body is the usual 400


@pytest.mark.parametrize("ctype", ["application/json", "application/json; charset=utf-8", "Application/JSON"])
def test_json_in_any_spelling_is_answered(ctype):
    assert call(_state(FakeEngine()), "POST", "/v1/completions", OK_BODY, headers={"Content-Type": ctype})[0] == 200


# -- Origin and CORS --------------------------------------------------------------------------------------
def test_no_cors_by_default_and_pages_are_refused():
    state = _state(FakeEngine())
    status, headers, _ = call(state, "GET", "/v1/models")
    assert status == 200 and not any(k.startswith("access-control") for k in headers)
    for method, path, extra in (("GET", "/v1/models", {}), ("POST", "/v1/completions", {}),
                                ("OPTIONS", "/v1/completions", {"Access-Control-Request-Method": "POST"})):  # fmt: skip
        status, headers, data = call(state, method, path, OK_BODY, headers={"Origin": "http://evil.example", **extra})
        assert status == 403 and _code(data) == "origin_not_allowed" and "--cors-origin" in data.decode()
        assert not any(k.startswith("access-control") for k in headers)


def test_a_named_origin_gets_cors_and_its_preflight_only():
    page = "http://localhost:3000"
    state = _state(FakeEngine(), cors_origins=(page,))
    status, headers, _ = call(state, "OPTIONS", "/v1/chat/completions", headers={
        "Origin": page, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"})  # fmt: skip
    assert status == 204 and headers["access-control-allow-origin"] == page
    assert "POST" in headers["access-control-allow-methods"] and "x-stainless-os" in headers["access-control-allow-headers"]
    status, headers, data = call(state, "POST", "/v1/completions", OK_BODY, headers={"Origin": page})
    assert status == 200 and headers["access-control-allow-origin"] == page and "Origin" in headers["vary"]
    assert json.loads(data)["choices"][0]["text"] == "Hello"
    status, headers, _ = call(state, "POST", "/v1/completions", OK_BODY, headers={"Origin": page, "Content-Type": "text/plain"})
    assert status == 415 and headers["access-control-allow-origin"] == page  # the page may read why
    status, headers, _ = call(state, "OPTIONS", "/v1/completions", headers={"Origin": "http://localhost:3001",
                                                                            "Access-Control-Request-Method": "POST"})  # fmt: skip
    assert status == 403 and "access-control-allow-origin" not in headers
    any_page = _state(FakeEngine(), cors_origins=("*",))
    assert call(any_page, "GET", "/v1/models", headers={"Origin": "http://a.example"})[1]["access-control-allow-origin"] == "*"


@pytest.mark.parametrize(("flag", "value"), [("--cors-origin", "localhost:3000"), ("--cors-origin", "http://a.example/page"),
                                             ("--allowed-host", "a/b"), ("--allowed-host", "")])  # fmt: skip
@pytest.mark.llama
def test_bad_flag_values_are_one_line_usage_errors(flag, value, tmp_path):
    proc = run_cli("serve", flag, value, "-m", str(tmp_path / "missing.gguf"), timeout=60, text=True)
    assert proc.returncode == 2, proc.stderr
    assert flag in proc.stderr and "Traceback" not in proc.stderr


# -- real sockets: uvicorn with the bounded protocol, in this process -----------------------------------------
class Held(FakeEngine):
    """Holds every answer until ``release`` is set: requests stay in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def submit(self, prepared: Any, on_text: Any, on_end: Any, on_reasoning: Any = None, **_: Any) -> Any:
        def later() -> None:
            self.release.wait(30)
            FakeEngine.submit(self, prepared, on_text, on_end)

        threading.Thread(target=later, daemon=True).start()
        return self


class Failing(FakeEngine):
    def prepare(self, request: Any, clamp: bool = False) -> Any:
        raise RuntimeError("a bug")


@contextlib.contextmanager
def serving(engine: Any = None, limits: Limits | None = None, **config: Any) -> Iterator[SimpleNamespace]:
    """uvicorn on 127.0.0.1:<free port> in a thread, with the protocol ``serve`` uses."""
    state = ServerState.holding(ServeConfig(**config), ("m",), engine or FakeEngine())
    limits = limits or Limits()
    limits = Limits(limits.max_header_bytes, limits.header_timeout_s, limits.body_timeout_s, limits.max_connections,
                    refused=lambda status: state.metrics.answered("connection", status))  # fmt: skip
    sock = listen("127.0.0.1", 0)
    uconfig = uvicorn.Config(create_app(state), http=protocol_class(limits), lifespan="off", ws="none", log_level="warning")
    server = uvicorn.Server(uconfig)
    started = server.startup

    async def startup(sockets: Any = None) -> None:
        state.hub = Hub(asyncio.get_running_loop())
        await started(sockets)

    server.startup = startup  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield SimpleNamespace(port=sock.getsockname()[1], state=state)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def read_all(s: socket.socket) -> bytes:
    """What the server sends until it closes (a reset ends it too)."""
    out = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := s.recv(65536):
            out += chunk
    return out


def get(port: int, path: str = "/health", sock: socket.socket | None = None) -> tuple[int, bytes]:
    """One request (on ``sock`` if given, kept open); the status and body."""
    s = sock or connect(port)
    try:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        while len(body) < length:
            body += s.recv(65536)
        return int(head.split()[1]), body
    finally:
        if sock is None:
            s.close()


def test_a_head_past_the_limit_is_431_and_one_within_it_is_answered():
    with serving(limits=Limits(max_header_bytes=4096)) as srv:
        s = connect(srv.port)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Long: " + b"a" * 5000)
        answer = read_all(s)
        assert answer.startswith(b"HTTP/1.1 431 ") and b'"headers_too_large"' in answer
        s = connect(srv.port)  # a URL counts as head too
        s.sendall(b"GET /" + b"a" * 5000)
        assert read_all(s).startswith(b"HTTP/1.1 431 ")
        s = connect(srv.port)
        head = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Long: " + b"a" * 3900 + b"\r\n\r\n"
        s.sendall(head)
        assert len(head) < 4096 and s.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert b'localinfer_requests_total{endpoint="connection",status="431"} 2' in get(srv.port, "/metrics")[1]


def test_a_pipelined_endless_head_is_bounded_too():
    """The next request's head on a kept-alive connection, sent before the first is answered."""
    engine = Held()
    with serving(engine, limits=Limits(max_header_bytes=4096)) as srv:
        s = connect(srv.port)
        body = json.dumps(OK_BODY).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            s.sendall(b"GET /health HTTP/1.1\r\nX: " + b"a" * 1_000_000)
        assert read_all(s) == b""  # closed: a 431 would land in the middle of the first answer
        engine.release.set()


def test_silent_and_unfinished_heads_are_closed_after_the_header_timeout():
    with serving(limits=Limits(header_timeout_s=0.5)) as srv:
        silent, partial, kept = connect(srv.port), connect(srv.port), connect(srv.port)
        partial.sendall(b"GET /health HTTP/1.1\r\nHost: local")
        assert get(srv.port, sock=kept)[0] == 200
        assert read_all(silent) == b""  # closed without a word: it never asked (never closed: a 10 s socket timeout)
        assert read_all(partial).startswith(b"HTTP/1.1 408 ")
        time.sleep(0.6)  # an idle kept-alive connection is uvicorn's keep-alive timeout's (30 s), not the head's
        assert get(srv.port, sock=kept)[0] == 200


def test_a_body_that_never_ends_is_closed_after_the_body_timeout():
    with serving(limits=Limits(body_timeout_s=0.5)) as srv:
        s = connect(srv.port)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{\"prompt\"")  # fmt: skip
        assert read_all(s) == b""  # closed (never closed: a 10 s socket timeout)


def test_past_the_connection_cap_the_longest_waiting_makes_room_and_requests_in_flight_are_kept():
    engine = Held()
    with serving(engine, limits=Limits(max_connections=4)) as srv:
        idle = [connect(srv.port) for _ in range(4)]
        time.sleep(0.2)
        assert get(srv.port)[0] == 200  # the oldest idle one made room
        assert read_all(idle[0]) == b""
        flights = []
        for _ in range(4):  # four requests the engine holds: nothing left to close
            s = connect(srv.port)
            body = json.dumps(OK_BODY).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
            flights.append(s)
            time.sleep(0.1)
        refused = connect(srv.port)
        assert read_all(refused).startswith(b"HTTP/1.1 503 ")
        engine.release.set()
        for s in flights:
            assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert get(srv.port)[0] == 200


def test_every_answer_is_counted_500s_included():
    with serving(Failing()) as srv:
        s = connect(srv.port)
        body = json.dumps(OK_BODY).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))  # fmt: skip
        assert read_all(s).startswith(b"HTTP/1.1 500 ")
        s = connect(srv.port)
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
        assert read_all(s).startswith(b"HTTP/1.1 403 ")
        get(srv.port, "/nothing")
        get(srv.port, "/health")
        text = get(srv.port, "/metrics")[1].decode()
    for labels in ('endpoint="completions",status="500"', 'endpoint="models",status="403"', 'endpoint="other",status="404"',
                   'endpoint="health",status="200"'):  # fmt: skip
        assert f"localinfer_requests_total{{{labels}}} 1" in text, text


def test_an_upgrade_request_is_answered_as_http_without_warnings():
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    with serving() as srv:  # uvicorn's log config is applied at start; its loggers do not propagate
        logging.getLogger("uvicorn.error").addHandler(handler)
        try:
            for upgrade, connection in ((b"websocket", b"Upgrade"), (b"h2c", b"Upgrade, HTTP2-Settings")):
                s = connect(srv.port)
                s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nUpgrade: %s\r\nConnection: %s\r\n\r\n" % (upgrade, connection))
                assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
                s.close()
            assert get(srv.port)[0] == 200
        finally:
            logging.getLogger("uvicorn.error").removeHandler(handler)
    assert [r.getMessage() for r in records] == []


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX descriptor limits")
def test_the_file_limit_is_lifted_and_bounds_the_connections():
    """With a hard limit of 300 descriptors serve can hold 236 connections, and says so."""
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (128, 300))\n"
        "from localinfer.serve.config import ServeConfig\nfrom localinfer.serve.http.server import http_config\n"
        "c = http_config(None, ServeConfig(), print)\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], c.http.limits.max_connections)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.splitlines() == ["at most 236 connections at once: the open-file limit is 300 (ulimit -n)", "300 236"]


# -- the floor: a real `serve` under a 100 MB head and 1,000 half-open connections --------------------------
HALF_OPEN = 1000
FLOOD_BYTES = 100 * 2**20


class Flood(threading.Thread):
    """Sends one endless header line, 100 MB in all; each time the server cuts it off, again."""

    def __init__(self, port: int, until: float) -> None:
        super().__init__(daemon=True)
        self.port, self.until = port, until
        self.sent = self.connections = 0
        self.answers: list[bytes] = []

    def run(self) -> None:
        chunk = b"a" * 65536
        while self.sent < FLOOD_BYTES and time.monotonic() < self.until:
            self.connections += 1
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                with contextlib.suppress(OSError):
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Flood: ")
                    while self.sent < FLOOD_BYTES and time.monotonic() < self.until:
                        s.sendall(chunk)
                        self.sent += len(chunk)
                with contextlib.suppress(OSError):
                    self.answers.append(s.recv(64))


def _serve_process(model: Any, home: Any, nofile: int | None, *args: str) -> tuple[subprocess.Popen, int]:
    import re
    import resource

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    env = {k: v for k, v in os.environ.items() if k != "LOCALINFER_API_KEY"}
    env.update({"LOCALINFER_HOME": str(home), "HF_HUB_OFFLINE": "1", "LOCALINFER_NO_LOG": "1"})
    cmd = [sys.executable, "-m", "localinfer", "serve", "-m", str(model), "--port", "0", "--offline", "-np", "1", "-c", "256", *args]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env, preexec_fn=limit)  # fmt: skip
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"listening on http://127\.0\.0\.1:(\d+)", line):
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # drain, so it never blocks
            return proc, int(m.group(1))
    raise AssertionError(f"serve did not start (rc {proc.wait()})")


def _wait_ready(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 120
    while True:
        with contextlib.suppress(AssertionError, OSError):
            if get(port)[0] == 200:
                return
        assert time.monotonic() < deadline and proc.poll() is None, "serve never became ready"
        time.sleep(0.1)


def _timed_health(port: int) -> float:
    t0 = time.perf_counter()
    assert get(port)[0] == 200
    return time.perf_counter() - t0


def _wait_closed(socks: list[socket.socket], timeout: float) -> tuple[int, float]:
    """How many of ``socks`` the server closed (EOF, reset, or an answer then EOF) within ``timeout``,
    and the seconds that took."""
    import selectors

    t0 = time.monotonic()
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    closed = 0
    while closed < len(socks) and time.monotonic() - t0 < timeout:
        for key, _ in sel.select(timeout=1):
            try:
                data = key.fileobj.recv(65536)  # type: ignore[union-attr]
            except ConnectionResetError:
                data = b""
            if not data:
                sel.unregister(key.fileobj)
                closed += 1
    sel.close()
    return closed, time.monotonic() - t0


def _ask(port: int, head: bytes, body: bytes = b"") -> bytes:
    """One raw request (``head`` without its blank line) on a connection of its own: the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head + b"\r\nConnection: close\r\n\r\n" + body)
        return read_all(s)


@pytest.mark.slow
def test_the_flags_reach_a_real_server(smollm2_path, tmp_path):
    page = b"http://localhost:3000"
    proc, port = _serve_process(smollm2_path, tmp_path / "home", None, "--allowed-host", "MyBox.lan", "--cors-origin",
                                page.decode(), "--header-timeout", "3", "--max-connections", "3")  # fmt: skip
    try:
        _wait_ready(proc, port)
        assert _ask(port, b"GET /v1/models HTTP/1.1\r\nHost: mybox.lan:8080").startswith(b"HTTP/1.1 200 ")
        assert _ask(port, b"GET /v1/models HTTP/1.1\r\nHost: evil.example").startswith(b"HTTP/1.1 403 ")
        cors = _ask(port, b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nOrigin: " + page)
        assert cors.startswith(b"HTTP/1.1 200 ") and b"access-control-allow-origin: " + page in cors.lower()
        body = json.dumps({"prompt": "x", "max_tokens": 1}).encode()
        plain = _ask(port, b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\n"
                           b"Content-Length: %d" % len(body), body)  # fmt: skip
        assert plain.startswith(b"HTTP/1.1 415 ")
        slow = socket.create_connection(("127.0.0.1", port), timeout=10)
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: loc")
        assert read_all(slow).startswith(b"HTTP/1.1 408 ")
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        assert get(port)[0] == 200  # the fourth connection made room: the oldest idle one is closed
        assert read_all(idle[0]) == b""
        for s in idle[1:]:  # the others are still open (their header timeout is seconds away)
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(1)
        for s in idle:
            s.close()
        text = get(port, "/metrics")[1].decode()
        assert 'endpoint="models",status="403"} 1' in text and 'endpoint="completions",status="415"} 1' in text
        assert 'endpoint="connection",status="408"} 1' in text
    finally:
        proc.kill()
        proc.wait(60)


@pytest.mark.slow
@pytest.mark.parametrize("nofile", [1024, None], ids=["ulimit-1024", "ulimit-inherited"])
def test_serve_stays_healthy_under_a_100mb_head_and_1000_half_open_connections(smollm2_path, tmp_path, nofile):
    """The issue's floor. Figures are printed (pytest -s); the asserts leave room for a busy machine:
    every probe answered, none slower than 1 s (a lock-out took 9 s and more), memory within 50 MB."""
    resource = pytest.importorskip("resource")
    psutil = pytest.importorskip("psutil")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = HALF_OPEN + 200
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"needs {wanted} open files here (ulimit -Hn is {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    proc, port = _serve_process(smollm2_path, tmp_path / "home", nofile, "--header-timeout", "3")
    try:
        _wait_ready(proc, port)
        server = psutil.Process(proc.pid)
        idle = sorted(_timed_health(port) for _ in range(20))
        rss0 = server.memory_info().rss
        half_open = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(HALF_OPEN)]
        try:
            for s in half_open:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
            get(port)  # untimed: the server has taken the burst in (the floor is about holding them)
            time.sleep(0.2)
            flood = Flood(port, until=time.monotonic() + 20)
            flood.start()
            latencies, peak = [], rss0
            while flood.is_alive() or len(latencies) < 20:
                latencies.append(_timed_health(port))
                peak = max(peak, server.memory_info().rss)
                time.sleep(0.02)
            flood.join()
            closed, waited = _wait_closed(half_open, timeout=20)
        finally:
            for s in half_open:
                s.close()
        time.sleep(1)
        rss1 = server.memory_info().rss
    finally:
        proc.kill()
        proc.wait(60)
    mb, lat = 2**20, sorted(latencies)
    print(f"\nnofile {nofile}: /health idle p50 {idle[10] * 1e3:.1f} ms; under attack {len(lat)} probes, "
          f"p50 {lat[len(lat) // 2] * 1e3:.1f} ms, max {lat[-1] * 1e3:.1f} ms; flood {flood.sent / mb:.0f} MB over "
          f"{flood.connections} connections; RSS {rss0 / mb:.0f} MB before, {peak / mb:.0f} MB at most during, "
          f"{rss1 / mb:.0f} MB after; {closed}/{HALF_OPEN} half-open closed by the server {waited:.1f} s after the flood")  # fmt: skip
    assert flood.sent >= FLOOD_BYTES, "the flood did not get its 100 MB out in 20 s"
    assert all(a.startswith(b"HTTP/1.1 431 ") for a in flood.answers if a), flood.answers[:3]
    assert closed == HALF_OPEN
    assert lat[-1] < 1.0
    assert peak - rss0 < 50 * mb and rss1 - rss0 < 50 * mb


# -- numbers JSON does not have: Python's json reads NaN, Infinity and 1e999 -----------------------------
@pytest.mark.parametrize("number", ["NaN", "-Infinity", "1e999"])
@pytest.mark.parametrize("path, body, field", [
    ("/api/chat", '{"model": "m", "messages": [], "keep_alive": %s}', "'keep_alive'"),
    ("/api/generate", '{"model": "m", "prompt": "x", "options": {"temperature": %s}}', "'options.temperature'"),
    ("/api/generate", '{"model": "m", "prompt": "x", "extra": [1, {"x": %s}]}', "'extra[1].x'"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "temperature": %s}', "'temperature'"),
    ("/v1/completions", '{"prompt": "x", "top_p": %s}', "'top_p'"),
    ("/v1/messages", '{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "temperature": %s}', "'temperature'"),
    ("/v1/responses", '{"input": "hi", "temperature": %s}', "'temperature'"),
    ("/v1/embeddings", '{"input": "hi", "dimensions": %s}', "'dimensions'"),
])  # fmt: skip
def test_a_non_finite_number_in_any_body_is_a_400_naming_it(path, body, field, number):
    # keep_alive NaN was taken: /api/ps then answered 500 ("Out of range float values") until it changed
    prepared: list[Any] = []

    class Engine(FakeEngine):
        def prepare(self, request: Any, clamp: bool = False) -> Any:
            prepared.append(request)
            return super().prepare(request)

    status, _, data = call(_state(Engine()), "POST", path, raw=(body % number).encode())
    assert status == 400, (status, data)
    assert field in data.decode() and "number" in data.decode() and ("NaN" in data.decode() or "infinity" in data.decode())
    assert not prepared, "nothing reached the engine"


# -- a keyword's value of the wrong kind: a dict or list where a name goes was a TypeError, a 500 -------
_OBJ = {"type": "object", "properties": {"a": {"type": {}}}}
_FN = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string", "format": []}}}}}


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": HI, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": _OBJ}}}),
    ("/v1/chat/completions", {"messages": HI, "response_format": {"type": {}}}),
    ("/v1/chat/completions", {"messages": HI, "tools": [_FN]}),
    ("/v1/chat/completions", {"messages": HI, "tools": [{"type": {}, "function": {"name": "f"}}]}),
    ("/v1/responses", {"input": "hi", "tools": [{"type": [], "name": "f"}]}),
    ("/v1/responses", {"input": "hi", "text": {"format": {"type": {}}}}),
    ("/v1/messages", {"model": "m", "max_tokens": 4, "messages": HI, "tools": [{"name": "f", "input_schema": {"type": {}}}]}),
    ("/v1/messages", {"model": "m", "max_tokens": 4, "messages": HI, "tool_choice": {"type": {}}}),
    ("/api/chat", {"model": "m", "messages": HI, "format": {"type": {}}}),
    ("/api/generate", {"model": "m", "prompt": "x", "format": {"type": {}}}),
    ("/api/generate", {"model": "m", "prompt": "x", "format": []}),
    ("/api/chat", {"model": "m", "messages": HI, "tools": [{"type": [], "function": {"name": "f"}}]}),
])  # fmt: skip
def test_an_unhashable_keyword_value_is_a_400_not_a_500(path, body):
    engine = FakeEngine()
    engine.loaded = SimpleNamespace(template=SimpleNamespace(template="{{ messages }}"))  # Ollama's routes read it
    status, _, data = call(_state(engine), "POST", path, body)
    assert status == 400, (status, data)
    assert b"internal" not in data and b"TypeError" not in data
