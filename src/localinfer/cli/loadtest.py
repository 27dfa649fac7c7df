"""`bench --endpoint`: the load test's flags (vLLM ``bench serve``'s, under our names) and their
translation into a run of ``localinfer.remote.benchmark``. Without --endpoint, bench is local."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

if TYPE_CHECKING:
    from localinfer.remote.connection import Endpoint

_LOAD = "Load test (--endpoint)"

RateOpt = Annotated[Optional[str], typer.Option("--rate", metavar="R|inf", help="Requests per second, arriving as a Poisson process; inf: all at once. [default: inf]", rich_help_panel=_LOAD, show_default=False)]
RequestsOpt = Annotated[Optional[int], typer.Option("--requests", min=1, help="Requests to send (per rate). [default: 100]", rich_help_panel=_LOAD, show_default=False)]
BurstinessOpt = Annotated[Optional[float], typer.Option("--burstiness", min=0.001, help="Gamma shape of the arrival gaps: 1 = Poisson, < 1 burstier, > 1 more even. [default: 1]", rich_help_panel=_LOAD, show_default=False)]
MaxConcurrencyOpt = Annotated[Optional[int], typer.Option("--max-concurrency", min=1, help="At most this many requests in flight (more wait on the client).", rich_help_panel=_LOAD)]
InputLenOpt = Annotated[Optional[int], typer.Option("--input-len", min=1, help="Prompt length in words of random text (about one token each). [default: 256]", rich_help_panel=_LOAD, show_default=False)]
OutputLenOpt = Annotated[Optional[int], typer.Option("--output-len", min=1, help="Tokens to generate per request (end of text ignored where the server allows). [default: 64]", rich_help_panel=_LOAD, show_default=False)]
DatasetOpt = Annotated[Optional[Path], typer.Option("--dataset", help="Prompts from a JSONL file: {\"prompt\": ...} or {\"messages\": [...]}, optional \"max_tokens\".", rich_help_panel=_LOAD)]
SloOpt = Annotated[Optional[list[str]], typer.Option("--slo", metavar="NAME:MS", help="A service level for goodput: ttft:MS, tpot:MS, e2el:MS (repeatable, or comma-separated).", rich_help_panel=_LOAD)]
PercentilesOpt = Annotated[Optional[str], typer.Option("--percentiles", metavar="P,...", help="Latency percentiles to report, e.g. 50,90,99. [default: 99]", rich_help_panel=_LOAD, show_default=False)]
SweepOpt = Annotated[Optional[str], typer.Option("--sweep", metavar="R1,R2,...", help="Run at each request rate and write an HTML report (--report).", rich_help_panel=_LOAD)]
ReportOpt = Annotated[Optional[Path], typer.Option("--report", help="Where --sweep writes its HTML report (and a PNG beside it when Chromium is installed). [default: loadtest-DATE.html]", rich_help_panel=_LOAD, show_default=False)]


def asked(*values: Any) -> bool:
    """Whether any load-test flag was given (they need --endpoint)."""
    return any(v is not None for v in values)


def run(
    ep: Endpoint | None, *, model: list[str] | None, rate: str | None,
    requests: int | None, burstiness: float | None, max_concurrency: int | None, input_len: int | None,
    output_len: int | None, dataset: Path | None, slo: list[str] | None, percentiles: str | None, sweep: str | None,
    report: Path | None, seed: int, output: str, no_log: bool, quiet: bool, local_only: list[str],
) -> None:  # fmt: skip
    """Check the flags, run each rate, print the results (table or JSON) and write the sweep's report."""
    from localinfer.cli.common import handle_errors

    with handle_errors():
        from localinfer.errors import UsageError
        from localinfer.remote import benchmark as bm
        from localinfer.remote import metrics

        if ep is None:
            raise UsageError("--rate, --requests, --sweep and the other load-test flags need --endpoint URL")
        if local_only:
            raise UsageError(f"{', '.join(local_only)} measure a local model; with --endpoint use --input-len, --output-len, --requests, --rate")
        if output not in ("table", "json", "jsonl"):
            raise UsageError("bench --endpoint writes -o table, json or jsonl")
        if dataset is not None and input_len is not None:
            raise UsageError("give either --dataset or --input-len (random prompts), not both")
        names = [p.strip() for v in model or () for p in v.split(",") if p.strip()]
        if len(names) > 1:
            raise UsageError("bench --endpoint measures one model at a time (-m NAME)")
        spec = bm.LoadSpec(
            rates=bm.parse_rates(rate, sweep), requests=requests or 100, burstiness=burstiness or 1.0,
            max_concurrency=max_concurrency, input_len=input_len or 256, output_len=output_len or 64, dataset=dataset,
            seed=seed, percentiles=metrics.parse_percentiles(percentiles), slos=metrics.parse_slos(slo),
        )  # fmt: skip
        _run(ep, names[0] if names else None, spec, output=output, report=report if sweep else None,
             sweep=bool(sweep), no_log=no_log, quiet=quiet)  # fmt: skip


def _run(ep: Endpoint, model: str | None, spec: Any, *, output: str,
         report: Path | None, sweep: bool, no_log: bool, quiet: bool) -> None:  # fmt: skip
    import json

    from localinfer.backends import connect
    from localinfer.remote import benchmark as bm
    from localinfer.render.loadtest import result_lines
    from localinfer.render.stats import warn
    from localinfer.usage import history

    say = (lambda _m: None) if quiet else warn
    client = connect(ep, pool=1).client  # the load test drives the server's API itself
    results: list[dict[str, Any]] = []
    try:
        name = client.pick_model(model)
        items = bm.samples(spec)
        ignore_eos = bm.probe(client, name, items[0], say)
        for rate in spec.rates:
            progress = _RateProgress(rate, len(items), quiet)
            result = bm.run_level(client, name, spec, rate, items, ignore_eos=ignore_eos, progress=progress)
            progress.close(result)
            results.append(result)
            if output == "table":
                sys.stdout.write("\n".join(result_lines(result, spec.percentiles)) + "\n")
            elif output == "jsonl":
                sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()
            if history.logging_enabled(no_log):
                history.append(bm.history_record(result, name, client.ep.display), warn=warn)
        if output == "json":
            sys.stdout.write(json.dumps(results if sweep else results[0], indent=2) + "\n")
        if sweep:
            _write_report(results, spec.percentiles, report, say)
    finally:
        client.close()


class _RateProgress:
    """A line on stderr per rate (start, end), and a count on a terminal while it runs."""

    def __init__(self, rate: float, total: int, quiet: bool) -> None:
        from localinfer.render.term import is_tty

        self.total, self.done, self.quiet = total, 0, quiet
        self.tty = is_tty(sys.stderr)
        self.label = f"load test at {'inf' if rate == float('inf') else f'{rate:g}'} req/s"
        if not quiet:
            sys.stderr.write(f"{self.label}: {total} requests\n")
            sys.stderr.flush()

    def __call__(self) -> None:
        self.done += 1
        if self.tty and not self.quiet:
            sys.stderr.write(f"\r{self.label}: {self.done}/{self.total}")
            sys.stderr.flush()

    def close(self, result: dict[str, Any]) -> None:
        if self.quiet:
            return
        sys.stderr.write(("\r" if self.tty else "") + f"{self.label}: {result['completed']} done, {result['failed']} failed "
                         f"in {result['duration']:.1f} s\n")  # fmt: skip
        sys.stderr.flush()


def _write_report(results: list[dict[str, Any]], percentiles: tuple[float, ...], path: Path | None, say: Any) -> None:
    import datetime as dt

    from localinfer.render.sweep_report import render

    path = path or Path(f"loadtest-{dt.datetime.now():%Y%m%d-%H%M%S}.html")
    try:
        path.write_text(render(results, percentiles), encoding="utf-8")
    except OSError as exc:
        from localinfer.errors import UsageError

        raise UsageError(f"cannot write --report {path}: {exc.strerror or exc}") from None
    png = screenshot(path)
    sys.stderr.write(f"report: {path}" + (f" (and {png})" if png else "") + "\n")


def screenshot(page: Path, width: int = 1200, height: int = 1500) -> Path | None:
    """The page as a PNG beside it, by headless Chromium when one is installed; None otherwise."""
    import shutil
    import subprocess

    browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if browser is None:
        return None
    png = page.with_suffix(".png")
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={width},{height}",
           f"--screenshot={png.resolve()}", page.resolve().as_uri()]  # fmt: skip
    try:
        subprocess.run(cmd, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return png if png.is_file() else None
