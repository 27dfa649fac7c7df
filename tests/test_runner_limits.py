"""The resident command runner's limits, on a real runner process (no model, no server): a peer that
never sends is dropped after the receive timeout, a length prefix over the bound is refused at once,
and past the bound on commands at once a new connection is refused (its command then runs locally)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from localinfer.cli import runner as runner_module
from localinfer.resident import start

GENEROUS_S = 60  # a bound for the test only: each case ends in about a second


@pytest.fixture
def runner(tmp_path):
    folder = tmp_path / "resident"
    start.private_folder(folder)
    path = folder / "commands"
    listener = start.bind(path)
    life_r, life_w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "localinfer.cli.runner", "--socket", str(path), "--lock", str(folder / "lock"),
         "--socket-fd", str(listener.fileno()), "--life-fd", str(life_r), "--receive-timeout", "1", "--max-children", "2"],
        pass_fds=(listener.fileno(), life_r), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    listener.close()
    os.close(life_r)
    yield path
    os.close(life_w)  # the runner's "server" is gone: it exits
    proc.wait(GENEROUS_S)


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(GENEROUS_S)
    sock.connect(str(path))
    return sock


def _answer(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(4096):
        out += chunk
    return out


def test_a_peer_that_never_sends_is_dropped(runner):
    with _connect(runner) as sock:
        assert _answer(sock) == b"", "closed after the receive timeout, nothing said"


def test_a_length_prefix_over_the_bound_is_refused_at_once(runner):
    with _connect(runner) as sock:
        r, w = os.pipe()
        socket.send_fds(sock, [(0xFFFFFFF0).to_bytes(4, "big") + b"{"], [r, w, w])
        os.close(r)
        os.close(w)
        said = json.loads(_answer(sock))
    assert "refused" in said and str(runner_module.MAX_COMMAND_BYTES) in said["refused"]


def test_commands_past_the_bound_are_refused(runner):
    idle = [_connect(runner) for _ in range(2)]  # two commands still sending: the bound (2) is reached
    try:
        with _connect(runner) as third:
            said = json.loads(_answer(third))
        assert "refused" in said and "at once" in said["refused"]
    finally:
        for sock in idle:
            sock.close()
