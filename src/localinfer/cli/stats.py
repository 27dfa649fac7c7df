"""`localinfer stats`: what the usage history says - tokens, requests, TTFT and tok/s, per model and per day."""


import sys
from typing import Annotated, Optional

import typer

from localinfer.cli import options as o
from localinfer.cli.common import handle_errors


Command = o.choices("Command", "run", "chat", "batch", "bench", "serve")


@o.grouped
def stats(
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Only this model (name as recorded, or its sha256).")] = None,
    since: Annotated[Optional[str], typer.Option("--since", help="Only requests since: 7d, 12h, 30m, 2w, or a date (2025-01-31).")] = None,
    command: Annotated[Optional[Command], typer.Option("--command", help="Only requests of this command.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
    pricing: o.Cost = o.COST,
) -> None:
    """Usage from the history: tokens in and out, requests, TTFT and tok/s per model and per day."""
    with handle_errors():
        from localinfer.usage import history
        from localinfer.usage import stats as usage

        since_ts = usage.parse_since(since)
        cmd = command.value if command else None
        records = history.load_records(since=since_ts, model=model, command=cmd)
        summary = usage.summarize(records, pricing, since=since_ts, model=model, command=cmd)
        summary["database"] = str(history.db_path())
        if json_out:
            import json
            sys.stdout.write(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
            return
        from localinfer.render.usage import print_stats

        print_stats(summary)


def register(app: typer.Typer) -> None:
    app.command(name="stats")(stats)
