"""How `localinfer chat` reads its input: the prompt_toolkit REPL on a terminal, lines when piped."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from localinfer.chat.session import block_open, unwrap_block
from localinfer.cli.common import debug_enabled, print_error

if TYPE_CHECKING:
    from localinfer.cli.chat_session import ChatSession


def run_lines(session: ChatSession, lines: Any) -> int:
    """Piped chat: each line is a user turn (a \"\"\" block spans lines). A failed line (a bad command,
    a file that will not load) is reported and the session goes on, as in the REPL; the exit code of
    the last failure is returned (0: none). Ctrl-C ends it."""
    from localinfer.errors import LocalInferError, exit_code_for

    failed = 0

    def handle(text: str) -> bool:
        nonlocal failed
        try:
            return session.handle(text)
        except LocalInferError as exc:
            if debug_enabled():
                raise
            print_error(str(exc), exc.hint)
            failed = int(exit_code_for(exc))
            return True

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
        if not handle(text):
            return failed
    if pending is not None:
        handle(unwrap_block(pending))
    return failed


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
        except Exception as exc:  # a bug must not end the conversation
            if debug_enabled():
                raise
            print_error(f"internal error: {type(exc).__name__}: {exc}", "set LOCALINFER_DEBUG=1 to see the traceback")
