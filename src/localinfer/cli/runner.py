"""The resident server's command runner (``python -m localinfer.cli.runner``, started beside the
server by ``start.start``): the CLI imported once, a process forked per command (``command.hand_over``).

Each forked process takes the command's stdin, stdout and stderr (passed over the socket) as its
own fds 0-2, its arguments, environment, working directory and umask, rebuilds ``sys.std*`` as the
command's interpreter had them, and runs ``cli.main.main()`` - the full path, which finds the
resident server as any command does. Only the exit status (or the signal it died of) goes back;
a signal the command receives (Ctrl-C) is passed on to it. The runner is single-threaded (it forks)
and exits when the server does (EOF on a pipe the server holds) or when it is gone from its socket.

Trust (docs/security.md): a peer of another uid or mount namespace is dropped before a byte is read
(``start.peer_problem``). A refused command runs where it was typed: one whose environment differs
from the runner's in what a process reads as it starts (``start.startup_env``: PYTHONPATH, LD_PRELOAD...),
which the processes it starts would inherit. Limits: a peer must send its command within
``RECEIVE_TIMEOUT_S``, of at most ``MAX_COMMAND_BYTES``; at most ``MAX_CHILDREN`` commands at once.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import select
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

# What a resident `run` imports on its way to the answer: imported here once, not per command.
_PRELOAD = (
    "localinfer.cli.main", "localinfer.cli.run", "localinfer.cli.options", "localinfer.cli.common",
    "localinfer.cli.backend", "localinfer.render.stats", "localinfer.render.thinking", "localinfer.render.remote",
    "localinfer.usage.recorder", "localinfer.usage.history", "sqlite3", "localinfer.resident.backend",
    "localinfer.resident.client", "localinfer.serve.models.pool", "localinfer.backends.remote", "localinfer.remote.client",
    "localinfer.request.request", "localinfer.answer.answer", "localinfer.generate.run", "localinfer.generate.loading",
    "localinfer.api", "localinfer.engine.types",
    "localinfer.request.limits", "localinfer.request.structured", "localinfer.request.rules", "localinfer.engine.rpc", "localinfer.units",
    "localinfer.resident.place", "typer._click.decorators",
)  # fmt: skip
RECEIVE_TIMEOUT_S = 30.0  # a command is sent at once (a few kB): a peer that sends nothing is dropped
MAX_COMMAND_BYTES = 16 << 20  # argv and environment: Linux's own cap on both is a few MiB
MAX_CHILDREN = 256  # commands at once; past it a command runs in its own process


def _preload() -> None:
    import importlib

    for name in _PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as exc:  # the command imports it again, and fails as it would
            sys.stderr.write(f"localinfer runner: could not preload {name}: {type(exc).__name__}: {exc}\n")


class CommandRefused(Exception):
    """A command this runner does not take (its reason goes back to the client)."""


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The command: a 4-byte length and its JSON, the fds riding on the first bytes. Refused when the
    length is over ``MAX_COMMAND_BYTES``; OSError when it is cut short or slower than the timeout."""
    data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 3)
    body = bytearray(data)
    try:
        while len(body) < 4 or len(body) < 4 + int.from_bytes(body[:4], "big"):
            if len(body) >= 4 and int.from_bytes(body[:4], "big") > MAX_COMMAND_BYTES:
                raise CommandRefused(f"a command of more than {MAX_COMMAND_BYTES} bytes")
            more = conn.recv(1 << 16)
            if not more:
                raise ConnectionError("the command was cut short")
            body += more
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return json.loads(bytes(body[4:])), fds


def _streams(stdio: list[dict[str, Any]]) -> list[io.TextIOWrapper]:
    """sys.stdin/stdout/stderr over fds 0-2, as the command's interpreter built them (newline "\\n": POSIX)."""
    out = []
    for fd, how in enumerate(stdio):
        raw = io.FileIO(fd, "rb" if fd == 0 else "wb", closefd=False)
        buf: Any = raw
        if how["buffered"]:
            buf = io.BufferedReader(raw) if fd == 0 else io.BufferedWriter(raw)
        out.append(io.TextIOWrapper(buf, encoding=how["encoding"], errors=how["errors"], newline="\n",
                                    line_buffering=how["line_buffering"], write_through=how["write_through"]))  # fmt: skip
    return out


def _watch(conn: socket.socket) -> None:
    """Signals the command received, passed on; its client gone (killed): the process ends too."""
    pending = b""
    while True:
        try:
            data = conn.recv(64)
        except OSError:
            data = b""
        if not data:
            os.kill(os.getpid(), signal.SIGTERM)
            return
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip().isdigit():
                os.kill(os.getpid(), int(line))


def _as_started() -> None:
    """What an interpreter takes from its environment as it starts: the time zone, LC_CTYPE."""
    import locale
    import time

    time.tzset()
    try:
        locale.setlocale(locale.LC_CTYPE, "")
    except locale.Error:
        pass


def _child(conn: socket.socket, listener: socket.socket, life_fd: int, timeout_s: float, startup: dict[str, str]) -> NoReturn:
    """One command, in the forked process (never returns); ``startup``: the runner's ``start.startup_env``."""
    listener.close()
    os.close(life_fd)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def reply(message: dict[str, Any]) -> None:
        try:
            conn.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            pass

    conn.settimeout(timeout_s)
    try:
        command, fds = _receive(conn)
    except CommandRefused as exc:
        reply({"refused": str(exc)})
        os._exit(0)
    except (OSError, ValueError):
        os._exit(0)
    conn.settimeout(None)
    from localinfer.resident import command as handed
    from localinfer.resident.start import startup_env

    if command.get("identity") != handed.identity() or len(fds) != 3:
        reply({"refused": "another installation of localinfer"})
        os._exit(0)
    theirs = startup_env(command["env"])
    if theirs != startup:  # its PYTHONPATH, LD_PRELOAD...: its own interpreter's to read, never this one's children's
        differ = ", ".join(sorted(k for k in theirs.keys() | startup.keys() if theirs.get(k) != startup.get(k)))
        reply({"refused": f"an environment that differs from the runner's in what a process reads as it starts ({differ})"})
        os._exit(0)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(command["cwd"])
    os.umask(int(command["umask"]))
    os.environ.clear()
    os.environ.update(command["env"])
    _as_started()
    sys.argv = list(command["argv"])
    sys.stdin, sys.stdout, sys.stderr = _streams(command["stdio"])
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    reply({"pid": os.getpid()})
    threading.Thread(target=_watch, args=(conn,), name="localinfer-command-watch", daemon=True).start()
    end = _run()
    reply(end)
    os._exit(0)


def _run() -> dict[str, Any]:
    """cli.main.main(), ended as the interpreter ends a script: its status, or the signal it died of."""
    import atexit
    import traceback

    from localinfer.cli.main import exit_status, main

    end: dict[str, Any]
    try:
        main()
        end = {"exit": 0}
    except SystemExit as exc:
        end = {"exit": exit_status(exc.code)}
    except KeyboardInterrupt:
        traceback.print_exc()
        end = {"signal": int(signal.SIGINT)}
    except BaseException:  # as the interpreter: the traceback, status 1
        traceback.print_exc()
        end = {"exit": 1}
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # the interpreter's own last flush failing is status 120
            if "exit" in end and end["exit"] == 0:
                end = {"exit": 120}
    return end


def _running(pid: int) -> bool:
    """A command's process still runs (SIGCHLD ignored: the kernel reaps it as it exits)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localinfer.cli.runner")
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--lock", required=True, type=Path)
    parser.add_argument("--socket-fd", required=True, type=int)
    parser.add_argument("--life-fd", required=True, type=int)
    parser.add_argument("--receive-timeout", type=float, default=RECEIVE_TIMEOUT_S)
    parser.add_argument("--max-children", type=int, default=MAX_CHILDREN)
    args = parser.parse_args(argv)
    listener = socket.socket(fileno=args.socket_fd)
    listener.listen(256)  # again: SO_PEERCRED now names this process (clients check its mount namespace)
    mine = os.stat(args.socket).st_ino
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the commands' processes are reaped by the kernel
    from localinfer.resident import command
    from localinfer.resident.start import peer_problem, startup_env

    command.SERVING = True
    startup = startup_env()  # as this interpreter started (before any import could set one): a command's must match
    _preload()
    children: set[int] = set()
    try:
        while True:
            readable, _, _ = select.select([listener, args.life_fd], [], [])
            if args.life_fd in readable:
                return 0  # the server is gone
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            why = peer_problem(conn, serving=True)
            if why is not None:  # not a byte read: another uid, a sandbox of ours (another mount namespace)
                sys.stderr.write(f"localinfer runner: refused a connection: the process connecting {why}\n")
                conn.close()
                continue
            children = {pid for pid in children if _running(pid)}
            if len(children) >= args.max_children:
                with contextlib.suppress(OSError):
                    conn.sendall(b'{"refused": "too many commands at once"}\n')
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                try:
                    _child(conn, listener, args.life_fd, args.receive_timeout, startup)
                finally:  # never back into this loop: before its "pid", the command runs where it was typed
                    os._exit(1)
            children.add(pid)
            conn.close()
    finally:
        from localinfer.resident.start import unlink_if

        unlink_if(args.socket, mine, args.lock)


if __name__ == "__main__":
    sys.exit(main())
