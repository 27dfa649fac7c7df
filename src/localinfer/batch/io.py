"""`localinfer batch` input and output: requests from JSONL or text, results as resumable JSONL.

Input: JSONL, one request per line (``{"id": .., "prompt": ".."}`` or ``{"id": .., "messages": [..]}``,
optional ``max_tokens``, ``stop``, serve's sampling fields, ``logprobs``/``top_logprobs`` and OpenAI's
``response_format``, which overrides the command's ``--json-schema``/``--grammar``/``--format json``),
or plain text, one prompt per line (the
id is the line number). Blank lines are not requests. A line that is not a valid request becomes an
:class:`InputError` carrying its line number and the reason - never dropped silently.

Output: one JSON object per line, each written with a single ``write`` and flushed, so a killed job
leaves at most one torn line at the end. :func:`prepare_resume` cuts that line off, drops earlier
error records (those requests are tried again) and returns the ids already answered.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, BinaryIO, Generic, TypeVar

from localinfer.request import format_rules, rules
from localinfer.errors import UsageError
from localinfer.answer.finite import dumps as finite_dumps  # NaN/Infinity as null: JSON has neither
from localinfer.request.limits import BATCH_LINE_MAX_BYTES, NotText, loads, require_text
from localinfer.request.request import BatchRequest, InputError  # the lines' types, re-exported
from localinfer.request.rules import SAMPLING_FIELDS

# A line takes serve's sampling fields, checked by the same rules (localinfer.request.rules).
_FIELDS = ("id", "prompt", "messages", "max_tokens", *SAMPLING_FIELDS, "stop", "logprobs", "top_logprobs", "response_format",
           "tools", "tool_choice", "parallel_tool_calls")  # fmt: skip


def detect_format(text: str, name: str | None = None) -> str:
    """jsonl or text: from the file name's extension, else from the first non-blank line."""
    suffix = Path(name).suffix.lower() if name and name != "-" else ""
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix == ".txt":
        return "text"
    for line in text.splitlines():
        if line.strip():
            return "jsonl" if line.lstrip().startswith("{") else "text"
    return "text"


def parse_input(data: bytes | str, fmt: str = "auto", name: str | None = None,
                image_dir: Path | None = None) -> list[BatchRequest | InputError]:  # fmt: skip
    """Every non-blank line of the input, as a request or as an error naming the line. ``image_dir``:
    where the lines' ``file://`` image URLs are read (batch.images); None: they are refused."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    lines = raw.split(b"\n")
    if fmt == "auto":
        fmt = detect_format(raw[:65536].decode("utf-8", errors="replace"), name)
    if fmt not in ("jsonl", "text"):
        raise UsageError(f"--input-format must be auto, jsonl or text, not {fmt!r}")
    items: list[BatchRequest | InputError] = []
    for number, line_bytes in enumerate(lines, start=1):
        line_bytes = line_bytes.rstrip(b"\r")
        if not line_bytes.strip():
            continue
        if len(line_bytes) > BATCH_LINE_MAX_BYTES:  # refused before parsing: 60 MB took 83 s and 5.9 GB
            items.append(InputError(number, f"the line is {len(line_bytes):,} bytes; a request may take {BATCH_LINE_MAX_BYTES:,}"))
            continue
        try:
            line = line_bytes.decode("utf-8")
        except UnicodeDecodeError as exc:
            items.append(InputError(number, f"not valid UTF-8 (byte {exc.start + 1})"))
            continue
        if fmt == "text":
            items.append(BatchRequest(id=number, line=number, prompt=line))
        else:
            items.append(_parse_json_line(line, number, image_dir))
    return items


def _parse_json_line(line: str, number: int, image_dir: Path | None = None) -> BatchRequest | InputError:
    try:
        obj = loads(line, "the line")
    except json.JSONDecodeError as exc:
        return InputError(number, f"not valid JSON: {exc.msg} (column {exc.colno})")
    except ValueError as exc:  # nested too deeply, an integer too long
        return InputError(number, f"not valid JSON: {exc}")
    if not isinstance(obj, dict):
        return InputError(number, "a request must be a JSON object")
    rid = obj.get("id", number)
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        return InputError(number, "'id' must be a string or an integer")
    try:  # anywhere in the line: the error record echoes the id, and unknown keys are named
        require_text(obj, line)
    except NotText as exc:
        return InputError(number, str(exc), None if exc.path == "id" else rid)
    unknown = sorted(set(obj) - set(_FIELDS))
    if unknown:
        return InputError(number, f"unknown field {', '.join(map(repr, unknown))} (allowed: {', '.join(_FIELDS)})", rid)
    try:
        given = {k: rules.check(k, obj[k]) for k in SAMPLING_FIELDS if obj.get(k) is not None}
        fmt, tools = _response_format(obj), _tools(obj)
        choice = tools.get("tool_choice")
        format_rules.tools_with_format("response_format" if fmt else None, bool(tools.get("tools")), choice.mode if choice else None)
        return BatchRequest(
            id=rid,
            line=number,
            prompt=_prompt(obj),
            messages=_messages(obj, image_dir),
            max_tokens=rules.check("max_tokens", obj["max_tokens"]) if obj.get("max_tokens") is not None else None,
            temperature=given.pop("temperature", None),
            seed=given.pop("seed", None),
            stop=rules.stop("stop", obj["stop"]) if obj.get("stop") is not None else None,
            logprobs=rules.logprobs_fields(obj.get("logprobs"), obj.get("top_logprobs"), legacy=True),
            sampling=tuple(given.items()),
            response_format=fmt,
            **tools,
        )
    except ValueError as exc:  # a RuleError (a schema we cannot enforce too), or _prompt's
        return InputError(number, str(exc), rid)


def _prompt(obj: dict[str, Any]) -> str | None:
    has_prompt, has_messages = obj.get("prompt") is not None, obj.get("messages") is not None
    if has_prompt == has_messages:
        raise ValueError("a request needs exactly one of 'prompt' or 'messages'")
    return rules.text("prompt", obj["prompt"]) if has_prompt else None


def _response_format(obj: dict[str, Any]) -> Any:
    """The line's own format; ``{"type": "text"}`` is False (free text, whatever the command says)."""
    if obj.get("response_format") is None:
        return None
    return format_rules.response_format("response_format", obj["response_format"]) or False


def _messages(obj: dict[str, Any], image_dir: Path | None) -> tuple[dict[str, Any], ...] | None:
    from localinfer.batch.images import read_file_parts

    messages = obj.get("messages")
    return None if messages is None else rules.messages("messages", read_file_parts(messages, image_dir))


def _tools(obj: dict[str, Any]) -> dict[str, Any]:
    """A line's ``tools``, ``tool_choice`` and ``parallel_tool_calls``, checked as serve checks them."""
    from localinfer.request.toolcalls import spec

    if obj.get("tools") is None and obj.get("tool_choice") is None:
        return {}
    offered = spec.tools("tools", obj.get("tools") or [], spec.check_schema)
    choice = spec.tool_choice("tool_choice", obj.get("tool_choice", "auto"), offered) if offered or obj.get("tool_choice") else None
    parallel = obj.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise rules.RuleError("parallel_tool_calls", f"must be true or false, not {rules.shown(parallel)}", "invalid_type")
    return {"tools": offered, "tool_choice": choice, "parallel_tool_calls": parallel}


# -- output ------------------------------------------------------------------------------------------

_R = TypeVar("_R")


class OutputOrder(Generic[_R]):
    """When a finished request's record may be written: at once, or (``keep_order``) once every
    request before it in the input has been written. Indexes count the pending requests from 0."""

    def __init__(self, keep_order: bool) -> None:
        self.keep_order = keep_order
        self._held: dict[int, _R] = {}
        self._next = 0

    def release(self, index: int, result: _R) -> list[_R]:
        """The results now ready to write, in order (``result`` itself, or none, or several)."""
        if not self.keep_order:
            return [result]
        self._held[index] = result
        ready = []
        while self._next in self._held:
            ready.append(self._held.pop(self._next))
            self._next += 1
        return ready



def id_key(value: Any) -> str:
    """Ids compare as JSON values: 3 and "3" are different ids."""
    return json.dumps(value, sort_keys=True)


def prepare_resume(path: Path) -> set[str]:
    """Make ``path`` ready to append to, and return the id keys (``id_key``) it already answers.

    A torn last line (the job was killed mid-write) is cut off; error records are removed, so those
    requests run again; a line that is not ours anywhere else is refused rather than overwritten.
    """
    if not path.exists():
        return set()
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1  # everything after the last newline is a torn write
    keep: list[bytes] = []
    done: set[str] = set()
    dropped = False
    for number, line in enumerate(data[:cut].split(b"\n")[:-1], start=1):
        if not line.strip():
            dropped = True
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            rec = None
        if not isinstance(rec, dict) or "id" not in rec:
            raise UsageError(
                f"{path}: line {number} is not a batch result, so it cannot be resumed",
                hint="pass another --output file, or resume without --resume to start over",
            )
        if "error" in rec or rec["id"] is None:
            dropped = True
            continue
        key = id_key(rec["id"])
        if key in done:
            dropped = True  # written twice by an older run: keep one
            continue
        done.add(key)
        keep.append(line + b"\n")
    if dropped:
        tmp = path.with_name(path.name + ".resume-tmp")
        tmp.write_bytes(b"".join(keep))
        os.replace(tmp, path)
    elif cut < len(data):
        with open(path, "r+b") as fh:
            fh.truncate(cut)
    return done


def check_output(path: Path) -> None:
    """Refuse an ``--output`` that cannot be written before any work is done (the sink opens it only
    after the model loaded): a missing or read-only folder, a folder in its place."""
    folder = path.parent
    if path.is_dir():
        problem = "it is a folder"
    elif not folder.is_dir():
        problem = f"there is no folder {folder}"
    elif not os.access(path if path.exists() else folder, os.W_OK):
        problem = f"{path if path.exists() else folder} is not writable"
    else:
        return
    raise UsageError(f"cannot write --output {path}: {problem}", hint="pass a file in a folder you can write")


class JsonlSink:
    """Writes each record as one whole line with one ``write`` call, flushed at once."""

    def __init__(self, stream: BinaryIO | None = None, path: Path | None = None, append: bool = False) -> None:
        self._fd: int | None = None
        self._stream = stream
        if path is not None:
            flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
            try:
                self._fd = os.open(path, flags, 0o644)
            except OSError as exc:  # what check_output could not foresee: one line, not a traceback
                raise UsageError(f"cannot write --output {path}: {exc.strerror or exc}",
                                 hint="pass a file in a folder you can write") from exc

    def __call__(self, record: dict[str, Any]) -> None:
        data = (finite_dumps(record, ensure_ascii=False) + "\n").encode("utf-8")  # NaN logprobs as null
        if self._fd is not None:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        else:
            assert self._stream is not None
            self._stream.write(data)
            self._stream.flush()

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            except OSError:
                pass
            os.close(self._fd)
            self._fd = None
