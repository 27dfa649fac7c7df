"""Where localinfer keeps its files, resolved when called (never at import time).

``LOCALINFER_HOME`` puts everything under one folder (tests use it); otherwise the platform's
data and config dirs (platformdirs): ``~/.local/share/localinfer`` and ``~/.config/localinfer``
on Linux.
"""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """Models, manifest, history, chat history."""
    home = os.environ.get("LOCALINFER_HOME")
    if home:
        return Path(home).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("localinfer", appauthor=False))


def config_dir() -> Path:
    """User overrides such as an extra ``models.toml``."""
    home = os.environ.get("LOCALINFER_HOME")
    if home:
        return Path(home).expanduser() / "config"
    import platformdirs

    return Path(platformdirs.user_config_dir("localinfer", appauthor=False))


def models_dir() -> Path:
    """The model store: verified blobs and the manifest."""
    return data_dir() / "models"


def file_identity(path: str | os.PathLike[str]) -> tuple[int, int, int, int, int] | None:
    """What tells a file's bytes apart cheaply: size, modification and change times (ns), inode and
    device; None when there is no such file. Rewriting a file in place moves its change time, which
    no one can set back (on POSIX; Windows reports the creation time there, and the rest must do)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def boot_id() -> str | None:
    """This run of the machine, where the OS names it (Linux): it changes at every restart, and so
    after any crash. None elsewhere."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return None
