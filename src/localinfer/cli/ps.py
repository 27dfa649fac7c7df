"""`localinfer ps` and `localinfer stop`: the models this user's resident server keeps loaded
(``--keep-alive``), and unloading them. Neither starts a server."""

import sys
from typing import Annotated, Optional

import typer

from localinfer.cli import options as o
from localinfer.cli.common import handle_errors


@o.grouped
def ps(
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    endpoint: o.Server = o.SERVER,
) -> None:
    """List the models kept loaded by --keep-alive (size, sequences, context, idle time, unload time);
    with --endpoint, what that `localinfer serve` (or Ollama) has loaded."""
    with handle_errors():
        import json

        from localinfer.resident import control

        state = control.endpoint_ps(endpoint) if endpoint else control.ps()
        if json_out:
            sys.stdout.write(json.dumps(state) + "\n")
            return
        if not state["models"]:
            sys.stderr.write(f"no model is loaded at {endpoint.display}\n" if endpoint else
                             "no model is resident (run a command with --keep-alive 5m to keep one loaded)\n")  # fmt: skip
            return
        sys.stdout.write(control.table(state["models"]))


def stop(
    name: Annotated[Optional[str], typer.Argument(metavar="[NAME]", help="The model to unload (a name or path `ps` shows).", show_default=False)] = None,
    all_models: Annotated[bool, typer.Option("--all", help="Unload every model; the resident server exits.")] = False,
) -> None:
    """Unload a resident model (or all of them: the server then exits, and the server `launch` started stops)."""
    with handle_errors():
        from localinfer.errors import UsageError
        from localinfer.resident import control

        if name and all_models:
            raise UsageError("give a NAME or --all, not both")
        stopped = control.stop(None if all_models else name)
        for model in stopped:
            sys.stderr.write(f"unloaded {model}\n")
        launched = None
        if name is None:  # everything: the server `localinfer launch` left running too
            from localinfer.launch import server

            launched = server.stop()
            if launched is not None:
                sys.stderr.write(f"stopped the server launch started at {launched['url']} (pid {launched['pid']})\n")
        if not stopped and launched is None:
            sys.stderr.write("no model is resident\n")


def register(app: typer.Typer) -> None:
    app.command(name="ps")(ps)
    app.command(name="stop")(stop)
