"""`localinfer stats`: what the usage history says - tokens, requests, TTFT and tok/s, per model and per day."""


import enum
import sys
from typing import Annotated, Optional

import typer

from localinfer.cli.common import handle_errors

_COST = "Cost"


class Command(str, enum.Enum):
    run = "run"
    chat = "chat"
    batch = "batch"
    bench = "bench"
    serve = "serve"


def stats(
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Only this model (name as recorded, or its sha256).")] = None,
    since: Annotated[Optional[str], typer.Option("--since", help="Only requests since: 7d, 12h, 30m, 2w, or a date (2025-01-31).")] = None,
    command: Annotated[Optional[Command], typer.Option("--command", help="Only requests of this command.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
    price_per_hour: Annotated[Optional[float], typer.Option("--price-per-hour", min=0.0, help="What the machine costs per hour (rented).", rich_help_panel=_COST)] = None,
    watts: Annotated[Optional[float], typer.Option("--watts", min=0.0, help="Power draw of your hardware while it works (with --kwh-price).", rich_help_panel=_COST)] = None,
    kwh_price: Annotated[Optional[float], typer.Option("--kwh-price", min=0.0, help="Electricity price per kWh (with --watts).", rich_help_panel=_COST)] = None,
    compare_api_price: Annotated[Optional[str], typer.Option("--compare-api-price", metavar="IN[,OUT]", help="An API's price per million tokens (input, output) to compare with.", rich_help_panel=_COST)] = None,
) -> None:
    """Usage from the history: tokens in and out, requests, TTFT and tok/s per model and per day."""
    with handle_errors():
        from localinfer.usage import cost
        from localinfer.usage import history
        from localinfer.usage import stats as usage

        pricing = cost.pricing(price_per_hour=price_per_hour, watts=watts, kwh_price=kwh_price, compare_api_price=compare_api_price)
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
