"""Chat files (`/save`, `/load`): OpenAI-style conversations as JSON, regular files only, read in
bounded memory; their messages checked by the rule table serve and batch lines use."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from localinfer.errors import UsageError


def write_chat_file(target: Path, data: dict[str, Any]) -> Path:
    """``data`` as JSON at ``target``, replaced atomically; returns the path written."""
    _refuse_unless_regular(target, "save to", follow=False)  # os.replace would replace a FIFO, device or link
    text = json.dumps(data, ensure_ascii=False, indent=2) + "\n"
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"cannot save to {target}: {exc.strerror or exc}") from None
    return target


def read_chat_file(source: Path) -> Any:
    """The JSON value in ``source`` (a regular file, at most CHAT_FILE_MAX_BYTES)."""
    from localinfer.request.limits import CHAT_FILE_MAX_BYTES, loads, read_limited

    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
        fd = os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            _refuse_unless_regular(source, "read", mode=os.fstat(fd).st_mode)
        except BaseException:
            os.close(fd)
            raise
        with open(fd, "rb") as fh:
            return loads(read_limited(fh, CHAT_FILE_MAX_BYTES, str(source)).decode("utf-8"), str(source))
    except OSError as exc:
        raise UsageError(f"cannot read {source}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{source} is not valid JSON: {exc}") from None


def _refuse_unless_regular(path: Path, verb: str, *, follow: bool = True, mode: int | None = None) -> None:
    """Chat files are regular files: a FIFO would block, a device or a link would be replaced."""
    if mode is None:
        try:
            mode = (path.stat() if follow else path.lstat()).st_mode
        except FileNotFoundError:
            return  # a new file
        except OSError:
            return  # the write itself says why
    if stat.S_ISREG(mode):
        return
    kind = ("a directory" if stat.S_ISDIR(mode) else "a symbolic link" if stat.S_ISLNK(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")  # fmt: skip
    raise UsageError(f"cannot {verb} {path}: it is {kind}; chat files are regular files")


def parse_messages(data: Any, where: str = "the conversation") -> tuple[list[dict[str, Any]], set[int]]:
    """Validate OpenAI-style messages (content as a string or a list of text parts); a leading
    system (or developer) message is the system prompt."""
    interrupted: set[int] = set()
    if isinstance(data, dict):
        marks = data.get("interrupted") or []
        if isinstance(marks, list):
            interrupted = {i for i in marks if isinstance(i, int)}
        data = data.get("messages")
    if not isinstance(data, list):
        raise UsageError(f"{where}: expected a list of messages or an object with \"messages\"")
    from localinfer.request.rules import RuleError, messages

    try:  # the roles and content shapes serve and batch lines take (localinfer.request.rules)
        out = [dict(m) for m in messages("messages", data, allow_empty=True, limit=None)]
    except RuleError as exc:
        raise UsageError(f"{where}: {exc}") from None
    return out, interrupted
