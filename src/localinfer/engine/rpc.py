"""llama.cpp's RPC backend: ``ggml-rpc-server`` processes on other machines as devices (``--rpc``).

To llama.cpp each server is a GPU with its own memory; adding one takes the three ggml calls of
llama.cpp's own ``--rpc`` (common/arg.cpp, add_rpc_devices). ggml aborts the whole process when it
cannot connect or the handshake fails, so each server is first probed here, in Python, and a server
that would make ggml abort becomes a one-line error instead.
"""

from __future__ import annotations

import ctypes
import socket
import struct
from collections.abc import Iterable

from localinfer.errors import NetworkError, UsageError

DEFAULT_PORT = 50052  # ggml-rpc-server's default
# ggml-rpc.h of the llama.cpp that llama-cpp-python 0.3.36 vendors: ggml refuses another major
# version, or a newer minor one, and then aborts.
PROTO_MAJOR, PROTO_MINOR = 7, 0
_CMD_HELLO = 14  # rpc_cmd RPC_CMD_HELLO, fixed in every protocol version
_CAPS = 24  # RPC_CONN_CAPS_SIZE: the hello request's size; the reply adds major, minor, patch, pad
CONNECT_TIMEOUT_S = 5.0
HELLO_TIMEOUT_S = 5.0
_SAME_SOURCE = "run a ggml-rpc-server built from llama-cpp-python 0.3.36's llama.cpp (benchmarks/build_rpc.sh)"
BUILD_HINT = 'rebuild it with the RPC backend: CMAKE_ARGS="-DGGML_RPC=ON" pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36'


def parse_endpoints(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"host:port,host:port"`` (or several such strings) -> ("host:port", ...), checked; UsageError if not."""
    if value is None:
        return ()
    parts = [value] if isinstance(value, str) else list(value)
    out: list[str] = []
    for item in (p.strip() for part in parts for p in part.split(",")):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        # ggml splits an endpoint at its first ':' and resolves the host as IPv4 (gethostbyname)
        ok = bool(sep) and bool(host) and ":" not in host and port.isdigit() and 0 < int(port) < 65536
        if not ok or any(c.isspace() or ord(c) < 32 for c in host):
            raise UsageError(
                f"--rpc takes HOST:PORT[,HOST:PORT...], not {item!r}",
                hint=f"e.g. --rpc 192.168.1.20:{DEFAULT_PORT} (IPv4 address or host name; port 1-65535)",
            )
        out.append(f"{host}:{int(port)}")
    return tuple(dict.fromkeys(out))


def _resolve(endpoint: str) -> str:
    """``host:port`` with the host as its IPv4 address: two names for one server are one server
    (a second connection to a server would wait: it serves one client at a time)."""
    host, _, port = endpoint.rpartition(":")
    try:
        return f"{socket.gethostbyname(host)}:{port}"
    except OSError as exc:
        raise NetworkError(f"cannot resolve the RPC server's host {host!r}: {exc}", hint="check the name in --rpc") from None


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        data += chunk
    return data


def probe(endpoint: str) -> tuple[int, int, int]:
    """Connect to a ggml-rpc-server and shake hands as ggml does; its protocol version. NetworkError
    (exit 5) for anything that would make ggml abort: unreachable, not an RPC server, busy, other version."""
    host, _, port = endpoint.rpartition(":")
    start = f"start one there: ggml-rpc-server -H <address> -p {port} (trusted networks only: see docs/hardware.md, --rpc)"
    try:
        sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise NetworkError(f"cannot reach the RPC server at {endpoint}: {exc.strerror or exc}", hint=start) from None
    with sock:
        sock.settimeout(HELLO_TIMEOUT_S)
        try:
            sock.sendall(struct.pack("<BQ", _CMD_HELLO, _CAPS) + bytes(_CAPS))
            size = struct.unpack("<Q", _recv_exact(sock, 8))[0]
            reply = _recv_exact(sock, size) if size == _CAPS + 4 else b""
        except TimeoutError:
            raise NetworkError(
                f"the RPC server at {endpoint} did not answer within {HELLO_TIMEOUT_S:.0f} s",
                hint="a ggml-rpc-server serves one client at a time: is another program using it?",
            ) from None
        except OSError as exc:
            raise NetworkError(f"the RPC server at {endpoint} broke off the handshake: {exc}", hint=start) from None
    if not reply:
        raise NetworkError(f"{endpoint} did not answer as a ggml-rpc-server of protocol {PROTO_MAJOR}.x", hint=_SAME_SOURCE)
    version = (reply[0], reply[1], reply[2])
    if version[0] != PROTO_MAJOR or version[1] > PROTO_MINOR:
        raise NetworkError(
            f"the RPC server at {endpoint} speaks protocol {'.'.join(map(str, version))}, "
            f"this llama-cpp-python {PROTO_MAJOR}.{PROTO_MINOR}",
            hint=_SAME_SOURCE,
        )
    return version


def registered() -> list[str]:
    """Endpoints whose devices llama.cpp already has (an RPC device's description is its endpoint)."""
    from localinfer.engine import backend

    return list(dict.fromkeys(d["description"] for d in backend.devices() if d.get("backend") == "RPC"))


def add_servers(endpoints: Iterable[str]) -> list[str]:
    """Make each server's devices llama.cpp devices, once per server per process (llama.cpp keeps
    them until the process ends); the endpoints newly added. UsageError (exit 2) on a build without
    the RPC backend, NetworkError (exit 5) for a server that cannot be used."""
    from localinfer.engine import backend

    endpoints = parse_endpoints(list(endpoints))  # the library API's values are checked as --rpc's
    if not endpoints:
        return []
    backend.ensure_backend(None)
    lib = _rpc_api(backend._ggml())
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise UsageError("--rpc needs a llama-cpp-python built with the RPC backend, and this one is not", hint=BUILD_HINT)
    wanted = list(dict.fromkeys(_resolve(e) for e in endpoints))
    have = set(registered())
    added = []
    for endpoint in wanted:
        if endpoint in have:
            continue
        probe(endpoint)
        add = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(
            lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
        )
        server_reg = add(endpoint.encode())
        if not server_reg:
            raise NetworkError(f"the RPC server at {endpoint} offers no device", hint="see ggml-rpc-server's --device")
        lib.ggml_backend_register(server_reg)
        added.append(endpoint)
    return added


def _rpc_api(lib):
    """The ggml calls that add an RPC server (ggml's C API, not bound by llama-cpp-python)."""
    p = ctypes.c_void_p
    for name, res, args in (
        ("ggml_backend_reg_by_name", p, [ctypes.c_char_p]),
        ("ggml_backend_reg_get_proc_address", p, [p, ctypes.c_char_p]),
        ("ggml_backend_register", None, [p]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib
