"""``--rpc`` without a real server: endpoints checked, the handshake probed against fake servers (every
way ggml would abort becomes a one-line error), and a CPU-only build refused with the build flag.
The real offload paths are in test_gpu_rpc.py (an RPC build and ggml-rpc-servers: .ci/rpc)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator

import pytest
from conftest import run_cli

from localinfer.engine import rpc
from localinfer.errors import NetworkError, UsageError


def test_endpoints_are_checked_and_deduplicated():
    assert rpc.parse_endpoints(None) == ()
    assert rpc.parse_endpoints("10.0.0.2:50052, gpu-box:1,10.0.0.2:50052") == ("10.0.0.2:50052", "gpu-box:1")
    assert rpc.parse_endpoints(["a:1", "b:2,c:3"]) == ("a:1", "b:2", "c:3")
    for bad in ("host", ":50052", "host:", "host:0", "host:65536", "host:x", "::1:50052", "a b:1", "h:+5"):
        with pytest.raises(UsageError, match="HOST:PORT"):
            rpc.parse_endpoints(bad)


@pytest.fixture
def fake_server() -> Iterator[Callable[[Callable[[socket.socket], None]], str]]:
    """A loopback TCP server whose one connection ``handler`` serves; its endpoint."""
    servers: list[socket.socket] = []

    def start(handler: Callable[[socket.socket], None]) -> str:
        srv = socket.create_server(("127.0.0.1", 0))
        servers.append(srv)

        def serve() -> None:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                handler(conn)

        threading.Thread(target=serve, daemon=True).start()
        return f"127.0.0.1:{srv.getsockname()[1]}"

    yield start
    for srv in servers:
        srv.close()


def _hello_reply(major: int, minor: int, patch: int = 0) -> Callable[[socket.socket], None]:
    def handler(conn: socket.socket) -> None:
        request = b""
        while len(request) < 1 + 8 + 24:
            request += conn.recv(64)
        cmd, size = struct.unpack("<BQ", request[:9])
        assert (cmd, size) == (14, 24)  # RPC_CMD_HELLO with the 24 bytes of connection caps
        conn.sendall(struct.pack("<Q", 28) + bytes([major, minor, patch, 0]) + bytes(24))

    return handler


def test_probe_shakes_hands_as_ggml_does(fake_server):
    assert rpc.probe(fake_server(_hello_reply(7, 0, 3))) == (7, 0, 3)


@pytest.mark.parametrize("version", [(6, 1), (8, 0), (7, 1)])
def test_a_server_of_another_protocol_is_refused_before_ggml_aborts(fake_server, version):
    endpoint = fake_server(_hello_reply(*version))
    with pytest.raises(NetworkError, match=f"speaks protocol {version[0]}.{version[1]}.0") as err:
        rpc.probe(endpoint)
    assert "build_rpc.sh" in err.value.hint


def test_something_that_is_not_an_rpc_server_is_refused(fake_server):
    endpoint = fake_server(lambda conn: conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n"))
    with pytest.raises(NetworkError, match="did not answer as a ggml-rpc-server"):
        rpc.probe(endpoint)


def test_a_busy_server_is_named_as_such(fake_server, monkeypatch):
    monkeypatch.setattr(rpc, "HELLO_TIMEOUT_S", 0.3)
    done = threading.Event()
    endpoint = fake_server(lambda conn: done.wait(5))  # accepts, never answers: serving someone else
    try:
        with pytest.raises(NetworkError, match="did not answer within") as err:
            rpc.probe(endpoint)
    finally:
        done.set()
    assert "one client at a time" in err.value.hint


def test_an_unreachable_server_says_how_to_start_one():
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
    with pytest.raises(NetworkError, match=f"cannot reach the RPC server at 127.0.0.1:{port}") as err:
        rpc.probe(f"127.0.0.1:{port}")
    assert f"ggml-rpc-server -H <address> -p {port}" in err.value.hint


def test_the_cli_validates_rpc_and_names_the_build_flag(smollm2_path):
    bad = run_cli("run", "-m", str(smollm2_path), "--rpc", "nohostport", "-p", "hi", timeout=60)
    assert bad.returncode == 2 and b"--rpc takes HOST:PORT" in bad.stderr
    from localinfer.engine.backend import backends

    if "RPC" in backends():  # an RPC build: test_gpu_rpc.py covers it with real servers
        return
    for args in (("run", "-m", str(smollm2_path), "-n", "2", "-p", "hi"), ("doctor",)):
        proc = run_cli(*args, env={"LOCALINFER_RPC": "127.0.0.1:50052"}, timeout=60)
        assert proc.returncode == 2, proc.stderr
        first, hint = proc.stderr.decode().splitlines()[-2:]
        assert first == "Error: --rpc needs a llama-cpp-python built with the RPC backend, and this one is not"
        assert 'CMAKE_ARGS="-DGGML_RPC=ON"' in hint and proc.stdout == b""


@pytest.mark.slow
def test_a_load_registers_its_rpc_servers_once(smollm2_path, monkeypatch):
    from localinfer.generate import loading
    from localinfer.engine.types import LoadOptions
    from localinfer.store import resolve_model

    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(rpc, "add_servers", lambda endpoints: calls.append(tuple(endpoints)) or [])
    loaded = loading.load(resolve_model(str(smollm2_path)), LoadOptions(n_ctx=256, rpc_servers=("10.0.0.2:50052",)))
    try:
        assert calls == [("10.0.0.2:50052",)]  # before the pre-flight, which plans with their memory; not again
    finally:
        loaded.close()


@pytest.mark.slow
def test_a_bench_registers_the_rpc_servers_of_all_its_configurations_once(smollm2_path, monkeypatch):
    from localinfer.bench import method, sweep
    from localinfer.engine.types import LoadOptions
    from localinfer.store import resolve_model

    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(rpc, "add_servers", lambda endpoints: calls.append(tuple(endpoints)) or [])
    configs = [LoadOptions(n_threads=t, rpc_servers=("10.0.0.2:50052",)) for t in (1, 2)]
    tests = method.expand_tests((8,), (), (), (0,))
    results = list(sweep.run_bench([resolve_model(str(smollm2_path))], configs, tests, 1, warmup=False))
    assert len(results) == 2 and calls == [("10.0.0.2:50052", "10.0.0.2:50052")]  # add_servers dedupes
