"""The lean `run --keep-alive` path: hand the whole command to the resident server's command runner.

A resident answer's own work is a few milliseconds; a fresh interpreter importing Typer, the
option groups and the request code costs more than the answer. So `localinfer run` with keep-alive
on is recognised before anything heavy is imported (:func:`hand_over`, called by ``cli.main``), and
the command - its arguments, environment, working directory, umask and its stdin, stdout and stderr
themselves (file descriptors passed over the Unix socket) - is run by ``cli.runner``, which has
imported the CLI once and forks a process per command: the full Typer path, unchanged, on the
user's own terminal or pipes. Output, exit codes, --json keys, errors and the usage history are
those of a local process by construction (the same code runs); only its exit status comes back.

Anything else runs here as before (None): keep-alive off, --endpoint, no Unix sockets, a runner of
another installation, a runner that cannot be reached. Only this module and ``resident.start`` are
imported here, and from the standard library only what a socket needs (socket itself only once keep-alive
is on: every `localinfer run` imports this module).
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import socket

SERVING = False  # True in the runner: a command it runs takes the full path (never handed over again)
_OFF = ("", "0", "off", "no", "false")  # --keep-alive values that mean off (units.parse_keep_alive)
_FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")  # passed on to the command's process


def wants_resident(args: list[str], environ: dict[str, str] | os._Environ) -> bool:
    """Whether `run ARGS` has keep-alive on (the flag's last value, else LOCALINFER_KEEP_ALIVE) and no
    server of its own (--endpoint). A guess that errs only costs time: the runner's command reads its
    flags with Typer and runs locally where the full path would."""
    value = environ.get("LOCALINFER_KEEP_ALIVE")
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--keep-alive" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--keep-alive="):
            value = arg.partition("=")[2]
        elif arg.startswith("--endpoint"):
            return False
    if environ.get("LOCALINFER_ENDPOINT") or "_LOCALINFER_COMPLETE" in environ:
        return False
    return value is not None and value.strip().lower() not in _OFF


def identity() -> dict[str, str]:
    """What must match between a command and the runner that runs it: the same installation (an
    upgrade rewrites the package's files: a runner started before it is not used)."""
    import localinfer

    here = os.path.abspath(localinfer.__file__)
    return {"localinfer": here, "version": localinfer.__version__, "installed": str(os.stat(here).st_mtime_ns),
            "python": sys.executable, "python_version": sys.version}  # fmt: skip


def hand_over(argv: list[str]) -> int | None:
    """Run `localinfer run ...` (``argv``: sys.argv) in the resident server's command runner, starting
    the server if none runs; its exit status, or None when it must run here (nothing was done yet)."""
    if SERVING or not wants_resident(argv[2:], os.environ):
        return None
    from localinfer.resident import start

    if not start.unix_sockets():
        return None
    try:
        from localinfer import paths

        where = start.place(paths.data_dir())
    except Exception:  # an unusable data dir: the full path says so
        return None
    try:
        sock = start.connect(where.commands)
        if sock is None:
            with start.locked(where):
                started = start.start(where)  # before anything else: the server imports while we connect
            if started is not None:
                os.close(started.ready)  # the runner's answer is what we wait for
            sock = start.connect(where.commands)
        if sock is None:
            return None
    except OSError:  # a read-only data dir, a folder in the way: the full path warns and runs locally
        return None
    with sock:
        return _converse(sock, argv, where.log)


def _stdio() -> list[dict[str, object]] | None:
    """How this interpreter set up its stdin, stdout and stderr (the runner's command gets the same)."""
    out = []
    for fd, stream in enumerate((sys.stdin, sys.stdout, sys.stderr)):
        if stream is None or getattr(stream, "buffer", None) is None:
            return None
        try:
            os.fstat(fd)
            if stream.fileno() != fd:
                return None
        except (OSError, ValueError, AttributeError):
            return None
        buffered = hasattr(stream.buffer, "raw")  # -u: the text layer writes to the FileIO itself
        out.append({"encoding": stream.encoding, "errors": stream.errors, "line_buffering": stream.line_buffering,
                    "write_through": stream.write_through, "buffered": buffered})  # fmt: skip
    return out


def _converse(sock: socket.socket, argv: list[str], log: object) -> int | None:
    import signal
    import socket

    stdio = _stdio()
    if stdio is None:
        return None
    umask = os.umask(0)
    os.umask(umask)
    header = json.dumps({"identity": identity(), "argv": argv, "env": dict(os.environ), "cwd": os.getcwd(),
                         "umask": umask, "stdio": stdio}).encode()  # fmt: skip
    try:
        socket.send_fds(sock, [len(header).to_bytes(4, "big") + header[:60000]], [0, 1, 2])
        if len(header) > 60000:
            sock.sendall(header[60000:])
        replies = sock.makefile("rb")
        first = replies.readline()
    except OSError:
        return None
    said = json.loads(first) if first else None
    if not said or "pid" not in said:  # refused (another installation), or gone before it began
        return None
    forwarded: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        try:
            sock.sendall(f"{signum}\n".encode())
        except OSError:
            pass

    for name in _FORWARDED:
        signal.signal(getattr(signal, name), forward)
    try:
        last = replies.readline()
    except OSError:
        last = b""
    end = json.loads(last) if last else {}
    if "exit" in end:
        return end["exit"]
    signum = end.get("signal") or (forwarded[-1] if forwarded else None)
    if signum:  # the command died of the signal (Ctrl-C, a kill): so does this process, as a local one would
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return 128 + signum
    sys.stderr.write("Error: the resident server's process for this command ended without an exit status\n"
                     f"  hint: see {log}; the next command starts a new server if it is gone\n")  # fmt: skip
    sys.stderr.flush()
    return 1
