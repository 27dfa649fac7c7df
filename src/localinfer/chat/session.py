"""How chat input reads: slash commands and triple-quoted blocks (plain text in, plain values out).

The session that runs them (turns, commands, what is printed and recorded) is ``cli.chat_session``;
the conversation itself (history, cache reuse, trimming, files) is ``chat.conversation``.
"""

from __future__ import annotations


def split_command(line: str) -> tuple[str, str]:
    """``"/set temperature 0"`` -> ``("set", "temperature 0")``."""
    body = line.strip()[1:]
    name, _, arg = body.partition(" ")
    return name.strip().lower(), arg.strip()


def block_open(text: str) -> bool:
    """Whether ``text`` starts a \"\"\" multi-line block that is not closed yet."""
    t = text.strip()
    return t.startswith('"""') and (len(t) < 6 or not t.endswith('"""'))


def unwrap_block(text: str) -> str:
    """The text inside a \"\"\" block (an unclosed one too); other text as it is."""
    t = text.strip()
    if not t.startswith('"""'):
        return text
    inner = t[3:-3] if len(t) >= 6 and t.endswith('"""') else t[3:]
    return inner.strip("\n")
