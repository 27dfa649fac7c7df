"""A reasoning model's thinking on screen: streamed dim to stderr (never to stdout, which carries
only the answer), ended by a blank line before the answer starts."""

from __future__ import annotations

import sys
from typing import Any

from localinfer.render.chat import dim
from localinfer.render.term import is_tty, styled


class ThinkingWriter:
    """``write`` each piece of thinking; ``end`` once the answer starts (or the turn ends)."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.dim = styled(self.stream)
        self.open = False  # thinking has been written and not yet ended

    def write(self, text: str) -> None:
        if not self.open:
            self.open = True
            text = "Thinking: " + text
        self.stream.write(dim(text, self.stream) if self.dim else text)
        self.stream.flush()

    def end(self) -> None:
        if self.open:
            self.open = False
            self.stream.write("\n\n")
            self.stream.flush()


def shows_thinking(hide: bool, stream: Any = None) -> bool:
    """Thinking is shown where a person reads it: on a terminal, unless ``--hide-thinking``."""
    return not hide and is_tty(stream if stream is not None else sys.stderr)
