"""The parser's events, apart from it: every answer's text steps are ``Text`` (``localinfer.generate.finish``),
and importing them should not import the tool-call machinery a request without tools never uses."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CallArgs", "CallStart", "Event", "Text"]


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArgs:
    index: int
    text: str


Event = Text | CallStart | CallArgs
