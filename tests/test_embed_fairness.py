"""A big embeddings request shares serve's engine, for real (SmolLM2): a chat stream keeps flowing
while a 2,048-input request runs (one embedding decode per engine step), a client that disconnects
stops its embedding work (cancelled before its next decode), and a request over the token cap is a
400 naming the cap (docs/security.md)."""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time

import pytest
from test_serve_model import ServeProcess

from localinfer.serve.wires.embeddings import MAX_TOKENS
from localinfer.serve.scheduler.record import FLUSH_S

pytestmark = pytest.mark.slow
BOUND_S = 600  # generous: a loaded CI machine is slow; nothing here is timed against it


def _ids(n_inputs: int, n_tokens: int) -> list[list[int]]:
    return [[100 + (i * 7 + k) % 4000 for k in range(n_tokens)] for i in range(n_inputs)]


def _request(port: int, path: str, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND_S)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)  # fmt: skip
    return sock


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(1 << 20):
        out += chunk
    return out


@pytest.fixture(scope="module")
def serve(smollm2_path, tmp_path_factory):
    home = tmp_path_factory.mktemp("embed-fair")
    # one thread: no pool of spinning workers on a loaded machine (generation and embedding alternate)
    with ServeProcess(smollm2_path, "-np", "2", "-c", "4096", "-t", "1", home=home) as s:
        yield s, home


def test_a_chat_stream_keeps_flowing_while_2048_inputs_are_embedded(serve):
    s, _home = serve
    stream = _request(s.port, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True,
                                                   "temperature": 0, "stream": True})  # fmt: skip
    arrivals: list[float] = []
    started = threading.Event()

    def read_stream() -> None:
        buf = b""
        while chunk := stream.recv(65536):
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if b'"text"' in event:
                    arrivals.append(time.monotonic())
                    if len(arrivals) >= 3:
                        started.set()

    reader = threading.Thread(target=read_stream, daemon=True)
    reader.start()
    assert started.wait(BOUND_S), "the stream started"
    t_sent = time.monotonic()
    embed = _request(s.port, "/v1/embeddings", {"input": _ids(2048, 2), "encoding_format": "base64"})
    first = embed.recv(1)  # the answer starts once every input is embedded
    t_answered = time.monotonic()
    body = first + _read_all(embed)
    stream.shutdown(socket.SHUT_RDWR)  # the reader sees the end; the server cancels the stream
    reader.join(BOUND_S)
    stream.close()
    head, _, payload = body.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), body[:300]
    assert len(json.loads(payload)["data"]) == 2048
    during = sum(t_sent < t < t_answered for t in arrivals)
    # 2,048 inputs of 2 tokens are 32 embedding decodes (64 inputs each), each beside one step of the stream: one
    # request that ran them all at once let through only the tokens already on their way (0-2).
    assert during >= 12, f"{during} tokens of the stream arrived while the embeddings ran"


def test_a_client_that_disconnects_stops_its_embedding_work(serve):
    s, home = serve
    db = home / "history.db"

    def rows() -> list[tuple]:
        if not db.exists():
            return []
        try:
            with sqlite3.connect(db) as con:
                return con.execute("SELECT finish_reason, exit_status, extra FROM requests").fetchall()
        except sqlite3.OperationalError as exc:  # the recorder made the file and not yet its table (as usage/history reads it)
            if "no such table" in str(exc):
                return []
            raise

    # the module's earlier requests are written within FLUSH_S of their answers: counted once settled, so
    # that the first new row is this request's (under load an earlier one's could land after `before`)
    before, still = len(rows()), time.monotonic()
    give_up = still + BOUND_S
    while time.monotonic() - still < 3 * FLUSH_S and time.monotonic() < give_up:
        if len(rows()) != before:
            before, still = len(rows()), time.monotonic()
        time.sleep(0.2)
    sock = _request(s.port, "/v1/embeddings", {"input": _ids(2048, 100)})  # 410 decodes of 5 inputs
    time.sleep(1.0)  # the request reaches the engine (not a bound: a later disconnect is the same case)
    sock.close()
    end = time.monotonic() + BOUND_S
    while len(rows()) == before and time.monotonic() < end:
        time.sleep(0.2)
    got = rows()[before:]
    assert got, "the request was recorded"
    finish, status, extra = got[0]
    assert (finish, status) == ("error", 1), "cancelled before its last decode, not run to its end"
    assert json.loads(extra)["inputs"] == 0
    with _request(s.port, "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "temperature": 0}) as again:
        assert _read_all(again).startswith(b"HTTP/1.1 200"), "the engine goes on"


def test_a_request_over_the_token_cap_is_a_400_naming_it(serve):
    s, _home = serve
    per = 500
    n = MAX_TOKENS // per + 1
    with _request(s.port, "/v1/embeddings", {"input": _ids(n, per)}) as sock:
        head, _, payload = _read_all(sock).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), head
    error = json.loads(payload)["error"]
    assert str(MAX_TOKENS) in error["message"] and error["param"] == "input", error
