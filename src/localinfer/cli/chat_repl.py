"""How `localinfer chat` reads its input: the prompt_toolkit REPL on a terminal, lines when piped.

Also the small parsers for that input: slash commands and \"\"\" multi-line blocks.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from localinfer.cli.common import debug_enabled, print_error

if TYPE_CHECKING:
    from localinfer.cli.chat import ChatSession


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


def run_lines(session: ChatSession, lines: Any) -> None:
    """Piped chat: each line is a user turn (a \"\"\" block spans lines); errors end it with their exit code."""
    pending: str | None = None
    for raw in lines:
        line = raw.rstrip("\n").rstrip("\r")
        if pending is not None:
            pending += "\n" + line
            if block_open(pending):
                continue
            text, pending = unwrap_block(pending), None
        elif block_open(line):
            pending = line
            continue
        else:
            text = line
        if not session.handle(text):
            return
    if pending is not None:
        session.handle(unwrap_block(pending))


def _history_file(session: ChatSession) -> Any:
    from prompt_toolkit.history import FileHistory, InMemoryHistory

    from localinfer.paths import data_dir

    path = data_dir() / "chat_history"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8"):
            pass
        return FileHistory(str(path))
    except OSError as exc:
        session.say(f"input history not saved: cannot write {path} ({exc.strerror or exc})")
        return InMemoryHistory()


def _prompt_session(session: ChatSession) -> Any:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.application import get_app
    from prompt_toolkit.filters import Condition
    from prompt_toolkit.key_binding import KeyBindings

    kb = KeyBindings()

    @kb.add("escape", "enter")
    def _newline(event: Any) -> None:
        event.current_buffer.insert_text("\n")

    @kb.add("enter", filter=Condition(lambda: block_open(get_app().current_buffer.text)))
    def _newline_in_block(event: Any) -> None:
        event.current_buffer.insert_text("\n")

    @kb.add("c-c")
    def _interrupt(event: Any) -> None:
        buf = event.current_buffer
        if buf.text:
            buf.reset()
        else:
            event.app.exit(exception=KeyboardInterrupt, style="class:aborting")

    return PromptSession(
        history=_history_file(session),
        key_bindings=kb,
        prompt_continuation="... ",
        placeholder="Send a message (/? for help)" if not os.environ.get("NO_COLOR") else None,
        enable_suspend=True,
    )


def run_repl(session: ChatSession) -> None:
    """The interactive chat: prompt, answer, dim stats line; errors are shown and the chat goes on."""
    from localinfer.errors import LocalInferError
    from localinfer.render.chat import banner, print_dim

    assert session.conv is not None
    print_dim(banner(session.conv), session.out)
    prompt = _prompt_session(session)
    while True:
        try:
            text = prompt.prompt(">>> ", handle_sigint=False)  # Ctrl-C is a key here; SIGINT is ours
        except KeyboardInterrupt:
            print_dim("(to quit, type /exit or press Ctrl-D)", session.out)
            continue
        except EOFError:
            break
        try:
            if not session.handle(unwrap_block(text)):
                break
        except KeyboardInterrupt:
            session.out.write("\n")
            print_dim("[interrupted]", session.out)
        except LocalInferError as exc:
            if debug_enabled():
                raise
            print_error(str(exc), exc.hint)
        except Exception as exc:  # noqa: BLE001 - a bug must not end the conversation
            if debug_enabled():
                raise
            print_error(f"internal error: {type(exc).__name__}: {exc}", "set LOCALINFER_DEBUG=1 to see the traceback")
