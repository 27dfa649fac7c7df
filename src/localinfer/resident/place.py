"""Where the resident server lives (a private folder in the data dir: socket 0600, folder 0700) and
how long a model stays loaded (``--keep-alive``), resolved when called."""

from __future__ import annotations

import math
import os
import re
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from localinfer.errors import UsageError

FOREVER = math.inf
_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)
SUN_PATH_MAX = 100  # AF_UNIX paths are at most 104-108 bytes, by platform: a longer one moves to /tmp


@dataclass(frozen=True)
class KeepAlive:
    """``--keep-alive`` on: how long the model stays loaded idle (math.inf: forever), how many at most."""

    seconds: float
    max_models: int | None = None


def parse_keep_alive(value: str | float | None) -> float | None:
    """``--keep-alive``: ``5m``, ``30s``, ``1h``, ``90`` (seconds); ``0``/``off`` -> None (off, the
    default); ``-1``/``forever`` -> math.inf. A bad value is a usage error."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return None if value == 0 else FOREVER if value < 0 else float(value)
    text = value.strip().lower()
    if text in ("", "0", "off", "no", "false"):
        return None
    if text in ("-1", "forever", "inf", "infinite"):
        return FOREVER
    m = _DURATION.match(text)
    if not m:
        raise UsageError(f"--keep-alive must be a duration such as 5m, 30s or 1h (0: off, -1: forever), not {value!r}")
    seconds = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
    return seconds or None


def show_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds == FOREVER:
        return "forever"
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def unix_sockets() -> bool:
    """Whether this platform has Unix domain sockets (Windows' Python does not expose AF_UNIX)."""
    return hasattr(socket, "AF_UNIX") and os.name == "posix"


@dataclass(frozen=True)
class Place:
    """The resident server's files: ``folder`` (0700) holds the lock, the log and (usually) the socket."""

    folder: Path
    socket: Path
    lock: Path
    log: Path


def place(data_dir: Path) -> Place:
    folder = data_dir / "resident"
    sock = folder / "socket"
    if len(os.fsencode(sock)) > SUN_PATH_MAX:  # a deep data dir: the socket in a private folder of /tmp
        import hashlib
        import tempfile

        digest = hashlib.sha256(os.fsencode(data_dir)).hexdigest()[:16]
        sock = Path(tempfile.gettempdir()) / f"localinfer-{os.getuid()}" / f"{digest}.sock"
    return Place(folder, sock, folder / "lock", folder / "server.log")


def private_folder(path: Path) -> None:
    """Create ``path`` (mode 0700) or check it: ours, and nobody else may enter it. OSError when the
    folder cannot be made (a read-only data dir, a file in the way) or is not private."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{path} is not a folder")
    if st.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to another user")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(f"{path} is not writable")
