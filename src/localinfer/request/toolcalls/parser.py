"""The model's text, as it comes, turned into content and tool calls: one parser for a streamed
answer and a whole one (a whole answer is the stream fed at once), so the deltas of a stream always
assemble to the calls of the same answer unstreamed.

Events: ``Text`` (content), ``CallStart`` (a call's index, id and name: OpenAI's first delta of a
call) and ``CallArgs`` (its arguments' JSON text).

A call counts only if it names an offered tool (``names``) and its arguments are a JSON object: an
answer in ``auto`` that merely starts with ``{`` is not constrained, so what it holds is checked
here, and a call's events are sent once the call is whole and checked (a call cut short by the
token limit is sent as written, as OpenAI does). Calls that fail are dropped; if none is left,
their text is content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from localinfer.request.toolcalls.events import CallArgs, CallStart, Event, Text
from localinfer.request.toolcalls.families import Family
from localinfer.request.toolcalls.spec import ToolCall, new_call_id


_HEADER = r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"%s"\s*:\s*'
_REPLY_OPENING = ("{", '"response"', ":", '"')  # the generic format's reply, up to its text (spaces between)
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _reply_opening(text: str) -> int | None:
    """Where the text of ``{"response": "`` starts in ``text``; -1 while ``text`` may still become that
    opening; None when it cannot (then it is calls)."""
    i = 0
    for token in _REPLY_OPENING:
        while i < len(text) and text[i].isspace():
            i += 1
        rest = text[i: i + len(token)]
        if rest != token:
            return -1 if token.startswith(rest) and i + len(rest) == len(text) else None
        i += len(token)
    return i


def _hex(text: str) -> int:
    return int(text, 16) if len(text) == 4 and all(c in "0123456789abcdefABCDEF" for c in text) else -1


@dataclass
class _Reply:
    """The generic format's ``{"response": "..."}``: its JSON string decoded as it is written, so the
    reply streams as text and a reply cut short by the token limit is its text so far, never JSON."""

    held: str = ""  # an escape not yet whole
    ended: bool = False

    def decode(self, text: str) -> str:
        text, self.held = self.held + text, ""
        out: list[str] = []
        i = 0
        while i < len(text) and not self.ended:
            ch = text[i]
            if ch == '"':
                self.ended = True
            elif ch != "\\":
                out.append(ch)
            elif i + 1 >= len(text) or (text[i + 1] == "u" and i + 6 > len(text)):
                self.held = text[i:]
                break
            elif text[i + 1] == "u":
                n, low = _hex(text[i + 2: i + 6]), text[i + 6: i + 12]
                if 0xD800 <= n < 0xDC00 and len(low) < 6 and "\\u".startswith(low[:2]):
                    self.held = text[i:]  # the low half of the pair may still come
                    break
                pair = _hex(low[2:]) if low.startswith("\\u") and len(low) == 6 else -1
                if 0xD800 <= n < 0xDC00 and 0xDC00 <= pair < 0xE000:
                    out.append(chr(0x10000 + ((n - 0xD800) << 10) + (pair - 0xDC00)))
                    i += 12
                    continue
                out.append("\ufffd" if n < 0 or 0xD800 <= n < 0xE000 else chr(n))  # a lone half is no text
                i += 6
                continue
            else:
                out.append(_ESCAPES.get(text[i + 1], text[i + 1]))
                i += 2
                continue
            i += 1
        return "".join(out)


@dataclass
class _Args:
    """Where the arguments' JSON value ends: depth of brackets outside strings."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    started: bool = False

    def scan(self, text: str) -> int | None:
        """The end of the value in ``text`` (an index past it), or None if it goes on."""
        for i, ch in enumerate(text):
            if not self.started:
                if ch.isspace():
                    continue
                self.started = True
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return i + 1
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth <= 0:
                    return i + 1
        return None


@dataclass
class CallParser:
    """Feed it the answer's pieces; ``calls`` and ``content`` are whole after ``finish``."""

    family: Family
    parallel: bool = True  # False: calls after the first are dropped (``parallel_tool_calls``)
    names: frozenset[str] | None = None  # the offered tools (None: any name)
    calls: list[ToolCall] = field(default_factory=list)
    content: str = ""
    _in_calls: bool = False
    _pending: str = ""  # content held back: it may be the start of a marker
    _seen_text: bool = False  # a non-space character came (an answer's leading JSON is no longer possible)
    _region: str = ""  # the raw text since the calls opened (content again if no call is found)
    _buf: str = ""  # of the region, what is not consumed yet
    _args: _Args | None = None
    _current: dict | None = None
    _reply: _Reply | None = None  # the generic format's reply, streamed as text

    def __post_init__(self) -> None:
        self._header = re.compile(_HEADER % re.escape(self.family.args_key))

    def feed(self, text: str) -> list[Event]:
        if not text:
            return []
        if self._in_calls:
            return self._feed_calls(text)
        self._pending += text
        return self._scan_text()

    def finish(self) -> list[Event]:
        """The end of the answer: held-back text is content; opened calls that hold none are content."""
        events: list[Event] = []
        if not self._in_calls:
            events += self._emit(self._pending)
            self._pending = ""
            return events
        if self._current is not None:  # cut short (max_tokens): keep what was written, as OpenAI does
            events += self._close_call(whole=False)
        if not self.calls and self._reply is None:
            events += self._emit(self._fallback(self._region))
        return events

    # -- content -----------------------------------------------------------------------------------
    def _scan_text(self) -> list[Event]:
        p = self._pending
        if not self._seen_text and self.family.leading:
            stripped = p.lstrip()
            if not stripped:
                return []
            lead = next((m for m in self.family.leading if stripped.startswith(m)), None)
            if lead is not None:
                return self._open(p[len(p) - len(stripped):], prefix="")
            if any(m.startswith(stripped) for m in self.family.leading):
                return []  # "[" may become "[{"
            self._seen_text = True
        hits = [(p.find(m), m) for m in self.family.starts if m in p]
        if hits:
            i, marker = min(hits)
            self._pending = ""
            return self._emit(p[:i]) + self._open(p[i + len(marker):], prefix=marker)
        keep = max((k for m in self.family.starts for k in range(1, len(m)) if p.endswith(m[:k])), default=0)
        self._pending = p[len(p) - keep:] if keep else ""
        return self._emit(p[: len(p) - keep])

    def _emit(self, text: str) -> list[Event]:
        if not text:
            return []
        self._seen_text = self._seen_text or bool(text.strip())
        self.content += text
        return [Text(text)]

    def _open(self, rest: str, prefix: str) -> list[Event]:
        self._in_calls, self._pending = True, ""
        self._region = prefix
        return self._feed_calls(rest)

    # -- calls ----------------------------------------------------------------------------------
    def _feed_calls(self, text: str) -> list[Event]:
        self._region += text
        self._buf += text
        if self.family.name == "generic" and not self.calls and self._args is None:
            if self._reply is not None:
                self._buf = ""
                return self._emit(self._reply.decode(text))
            start = _reply_opening(self._buf)
            if start == -1:
                return []  # '{"res' may be a reply or a call: wait
            if start is not None:
                self._reply, rest, self._buf = _Reply(), self._buf[start:], ""
                return self._emit(self._reply.decode(rest))
        events: list[Event] = []
        while self._buf:
            if self._args is None:
                m = self._header.search(self._buf)
                if m is None:
                    break
                try:
                    name = json.loads(f'"{m.group(1)}"')
                except ValueError:
                    name = m.group(1)
                self._buf = self._buf[m.end():]
                self._args, self._current = _Args(), {"name": name, "args": ""}
                continue
            end = self._args.scan(self._buf)
            piece = self._buf if end is None else self._buf[:end]
            self._buf = "" if end is None else self._buf[end:]
            if not self._current["args"]:
                piece = piece.lstrip()
            self._current["args"] += piece
            if end is None:
                break
            events += self._close_call(whole=True)
        return events

    def _close_call(self, whole: bool) -> list[Event]:
        """The call just read, as events if it counts (``whole``: it ended by itself, so its
        arguments must be a JSON object; else it was cut short and is kept as written)."""
        cur, self._current, self._args = self._current, None, None
        if cur is None or (not self.parallel and self.calls):
            return []
        if self.names is not None and cur["name"] not in self.names:
            return []  # a tool that was not offered: no call
        if whole and not is_object(cur["args"]):
            return []
        call = ToolCall(new_call_id(), cur["name"], cur["args"])
        self.calls.append(call)
        index = len(self.calls) - 1
        return [CallStart(index, call.id, call.name), *([CallArgs(index, call.arguments)] if call.arguments else [])]

    def _fallback(self, region: str) -> str:
        """Opened calls that hold none: the generic format's ``{"response": ...}`` is its text."""
        if self.family.name == "generic":
            try:
                obj = json.loads(region)
            except ValueError:  # cut short inside the wrapper (a reply streams as it comes: _Reply)
                return ""
            if isinstance(obj, dict) and isinstance(obj.get("response"), str):
                return obj["response"]
        return region


def is_object(text: str) -> bool:
    """Whether a call's arguments are whole: a JSON object."""
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def parse(family: Family, text: str, *, opening: str = "", parallel: bool = True,
          names: frozenset[str] | None = None) -> CallParser:  # fmt: skip
    """A whole answer (``opening``: what the prompt already wrote of it), parsed."""
    parser = CallParser(family, parallel, names)
    parser.feed(opening)
    parser.feed(text)
    parser.finish()
    return parser
