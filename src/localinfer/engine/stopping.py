"""Stop strings over a stream: never print a stop string, never hold back more than needed."""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Feed decoded text piece by piece; get back what is safe to print and whether a stop hit.

    Text that could be the start of a stop string is held back until the next piece decides it.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._firsts = "".join(sorted({s[0] for s in self._stops}))  # where any stop could begin
        self._pending = ""
        self.matched: str | None = None  # the stop string that ended the stream (Anthropic's stop_sequence)

    def feed(self, text: str) -> tuple[str, bool]:
        if not self._pending:  # the usual piece, on the per-token path: no stop can begin in it
            for c in self._firsts:
                if c in text:
                    break
            else:
                return text, False
        buf = self._pending + text
        first = min(((i, s) for s in self._stops if (i := buf.find(s)) >= 0), default=None)
        if first is not None:
            self._pending, self.matched = "", first[1]
            return buf[: first[0]], True
        keep = 0
        for s in self._stops:
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        self._pending = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """At the end of the stream, what was held back is answer text after all."""
        out, self._pending = self._pending, ""
        return out
