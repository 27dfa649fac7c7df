"""`localinfer chat`: a conversation with a model. A REPL (prompt_toolkit) on a terminal; when stdin or
stdout is not a terminal, each input line is a user turn and only the answers go to stdout.

The session (slash commands, turns, what is printed) is cli.chat_session, the same on a model here and
on a server (--endpoint); this module translates the flags and picks the input loop (cli.chat_repl).
"""

import io
import sys
from collections.abc import Iterator
from typing import TextIO

import typer

from localinfer.cli import options as o
from localinfer.cli.common import handle_errors


@o.grouped
def chat(
    model: o.ModelOpt = None,
    system: o.SystemOpt = None,
    sampling: o.Sampling = o.SAMPLING,
    max_tokens: o.MaxTokensOpt = None,
    stop: o.StopOpt = None,
    response_format: o.ResponseFormat = o.FORMAT,
    template_vars: o.TemplateVars = o.TEMPLATE,
    load_opts: o.Load = o.LOAD,
    draft: o.Drafting = o.DRAFT,
    flags: o.Common = o.COMMON,
    endpoint: o.Server = o.SERVER,
    keep_alive: o.Keep = o.KEEP_ALIVE,
) -> None:
    """Chat with a model: a REPL on a terminal (/help lists its commands); piped, each line is a turn.
    --json-schema, --grammar or --format json (or /set format) make every answer that JSON."""
    with handle_errors():
        from localinfer.chat.settings import ChatSettings
        from localinfer.cli.chat_repl import run_lines, run_repl
        from localinfer.cli.chat_session import ChatSession

        settings = ChatSettings(sampling=sampling, max_tokens=max_tokens, stop=tuple(stop or ()), response_format=response_format,
                                template_vars=template_vars)  # fmt: skip
        from localinfer.render.term import is_tty

        interactive = is_tty(sys.stdin) and is_tty(sys.stdout)
        session = ChatSession(
            load_opts=draft.apply(load_opts) if draft is not None else load_opts,
            offline=flags.offline,  # with HF_HUB_OFFLINE, applied by resolve_model
            force=flags.force,
            quiet=flags.quiet,
            verbose=flags.verbose,
            no_log=flags.no_log,
            interactive=interactive,
            endpoint=endpoint,  # a server: nothing is loaded here
            keep_alive=keep_alive,  # the model stays loaded in the resident server
        )
        session.open(model, system, settings)
        failed = 0
        try:
            if interactive:
                run_repl(session)
            else:
                failed = run_lines(session, _stdin_lines())
        finally:
            session.close()
        if not interactive and failed:
            raise typer.Exit(failed)


def register(app: typer.Typer) -> None:
    app.command(name="chat")(chat)


def _stdin_lines() -> Iterator[str] | TextIO:
    """Piped turns, each checked as UTF-8 and bounded (limits.utf8_lines): a bad line ends the
    session with exit 2, naming the line and byte."""
    if sys.stdin is None:
        return io.StringIO("")
    try:
        raw = sys.stdin.buffer
    except AttributeError:
        return sys.stdin
    from localinfer.request.limits import utf8_lines

    return utf8_lines(raw, "the input on stdin")
