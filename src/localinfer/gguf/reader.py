"""Opening a GGUF file for the parser: only a regular file is read (a FIFO swapped in for it cannot
hang the open), it is mapped read-only, and whatever the operating system says goes wrong becomes an
:class:`~localinfer.errors.InvalidModelError` or :class:`~localinfer.errors.ModelNotFoundError`.
"""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path

from localinfer.errors import InvalidModelError, ModelNotFoundError
from localinfer.gguf.parser import parse_buffer
from localinfer.gguf.types import GGUFInfo

__all__ = ["parse_gguf"]


def parse_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    """Validate a GGUF file's header (its format; not its hyperparameters) and return what it says,
    without reading tensor data.

    Raises :class:`ModelNotFoundError` if ``path`` does not exist, and :class:`InvalidModelError`
    (``"not a valid GGUF file: <reason>"``) for anything wrong with the bytes, or
    (``"cannot read <path>: <error>"``) when the file cannot be opened or read.
    """
    path = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    # O_NONBLOCK so that a FIFO swapped in for the file cannot hang open(); it does nothing for
    # regular files, which are all we go on to read.
    flags |= getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL in the path
        raise ModelNotFoundError(f"model file not found: {path}", hint="check the path") from None
    except OSError as exc:
        raise InvalidModelError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        try:
            st = os.fstat(fd)
        except OSError as exc:
            raise InvalidModelError(f"cannot read {path}: {exc.strerror or exc}") from exc
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise InvalidModelError(f"cannot read {path}: it is {kind}")
        size = st.st_size
        if size == 0:  # mmap cannot map an empty file
            return parse_buffer(b"", 0, path)
        try:
            buf = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise InvalidModelError(f"cannot read {path}: {exc}") from exc
        try:
            return parse_buffer(buf, size, path)
        except OSError as exc:  # an I/O error surfacing through the mapping
            raise InvalidModelError(f"cannot read {path}: {exc.strerror or exc}") from exc
        finally:
            buf.close()
    finally:
        os.close(fd)
