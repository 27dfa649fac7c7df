"""`localinfer bench`: prompt and generation speed, llama-bench's way, through our own engine.

The results table (or JSON/CSV/Markdown) is the command's output, on stdout; progress goes to stderr.
"""


import dataclasses
import sys
from typing import Annotated, Optional

import typer

from localinfer.cli import loadtest as lt
from localinfer.cli import options as o
from localinfer.cli.common import handle_errors

_BENCH = "Tests"


OutputFormat = o.choices("OutputFormat", "table", "json", "jsonl", "csv", "md")


ListOpt = Optional[list[str]]


def _ints(flag: str, values: list[str] | None, default: tuple, *, minimum: int = 0) -> tuple:
    """Comma-separated and/or repeated values ("-t 1,2 -t 4"); ranges as llama-bench: "1-4", "16-64*2"."""
    from localinfer.errors import UsageError

    if not values:
        return default
    out: list[int] = []
    for value in values:
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            try:
                out.extend(_expand(part))
            except ValueError:
                raise UsageError(f"{flag} takes numbers separated by commas, not {value!r}") from None
    if any(v < minimum for v in out):
        raise UsageError(f"{flag} values must be at least {minimum}")
    return tuple(dict.fromkeys(out))


def _expand(part: str) -> list[int]:
    if "-" not in part[1:]:
        return [int(part)]
    first, _, rest = part.partition("-")
    op = "*" if "*" in rest else "+"
    last, _, step = rest.partition(op)
    a, b, s = int(first), int(last), int(step or 1)
    if s <= (1 if op == "*" else 0) or b < a:
        raise ValueError(part)
    out = []
    while a <= b:
        out.append(a)
        a = a * s if op == "*" else a + s
    return out


def _pairs(values: list[str] | None) -> tuple[tuple[int, int], ...]:
    from localinfer.errors import UsageError

    out = []
    for value in values or ():
        try:
            p, n = (int(x) for x in value.split(","))
        except ValueError:
            raise UsageError(f"--pg takes PROMPT,GEN (e.g. 512,128), not {value!r}") from None
        if p < 1 or n < 1:
            raise UsageError("--pg sizes must be at least 1")
        out.append((p, n))
    return tuple(out)


def _models(values: list[str] | None) -> list[str | None]:
    names = [p.strip() for v in values or () for p in v.split(",") if p.strip()]
    return list(dict.fromkeys(names)) or [None]


@o.grouped
def bench(
    model: Annotated[ListOpt, typer.Option("--model", "-m", help="Model(s): names or .gguf paths, comma-separated or repeated.", rich_help_panel=o._CONTEXT)] = None,
    n_prompt: Annotated[ListOpt, typer.Option("--n-prompt", "-p", help="Prompt sizes for pp tests (0 = none). [default: 512]", rich_help_panel=_BENCH, show_default=False)] = None,
    n_gen: Annotated[ListOpt, typer.Option("--n-gen", "-n", help="Generated tokens for tg tests (0 = none). [default: 128]", rich_help_panel=_BENCH, show_default=False)] = None,
    pg: Annotated[ListOpt, typer.Option("--pg", "-pg", help="PROMPT,GEN: a prompt then a generation, timed together (repeatable).", rich_help_panel=_BENCH)] = None,
    depth: Annotated[ListOpt, typer.Option("--depth", "-d", help="Tokens already in the context before each test. [default: 0]", rich_help_panel=_BENCH, show_default=False)] = None,
    repetitions: Annotated[int, typer.Option("--repetitions", "-r", min=1, help="Timed repetitions of each test.", rich_help_panel=_BENCH)] = 5,
    no_warmup: Annotated[bool, typer.Option("--no-warmup", help="Skip the untimed warm-up run before each test.", rich_help_panel=_BENCH)] = False,
    parallel: Annotated[ListOpt, typer.Option("--parallel", "-np", help="Instead of pp/tg: N requests at once (e.g. 1,4,8), each a -p prompt and -n tokens (or --pg): aggregate t/s, TTFT and latency.", rich_help_panel=_BENCH)] = None,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the random prompt tokens and the sampler.", rich_help_panel=_BENCH)] = 0,
    threads: Annotated[ListOpt, typer.Option("--threads", "-t", help="CPU threads, one or more (1,2). Default: physical cores.", rich_help_panel=o._CONTEXT)] = None,
    ctx_size: Annotated[ListOpt, typer.Option("--ctx-size", "-c", help="Context size(s). Default: what the tests need.", rich_help_panel=o._CONTEXT)] = None,
    gpu_layers: Annotated[ListOpt, typer.Option("--gpu-layers", "-ngl", help="Layers to offload: auto, all or N; several allowed. [default: auto]", rich_help_panel=o._CONTEXT, show_default=False)] = None,
    batch_size: Annotated[ListOpt, typer.Option("--batch-size", "-b", help="Prompt tokens per llama_decode call; several allowed. [default: 2048]", rich_help_panel=o._CONTEXT, show_default=False)] = None,
    base: o.Load = o.LOAD.only("cpu_repack", "rpc", "flash_attn", "cache_type_k", "cache_type_v", "no_mmap"),
    pricing: o.Cost = o.COST,
    output: Annotated[OutputFormat, typer.Option("--output", "-o", help="Output format on stdout.")] = OutputFormat.table,
    progress: Annotated[bool, typer.Option("--progress", help="Progress lines on stderr even when it is not a terminal.")] = False,
    response_format: o.ResponseFormat = o.FORMAT,
    draft: o.Drafting = o.DRAFT,
    flags: o.Common = o.COMMON.only("force", "offline", "no_log"),  # its own --quiet and --verbose
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines on stderr; only the results on stdout.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show llama.cpp's log while models load and run.")] = False,
    endpoint: o.Server = o.SERVER,
    rate: lt.RateOpt = None,
    requests: lt.RequestsOpt = None,
    burstiness: lt.BurstinessOpt = None,
    max_concurrency: lt.MaxConcurrencyOpt = None,
    input_len: lt.InputLenOpt = None,
    output_len: lt.OutputLenOpt = None,
    dataset: lt.DatasetOpt = None,
    slo: lt.SloOpt = None,
    percentiles: lt.PercentilesOpt = None,
    sweep: lt.SweepOpt = None,
    report: lt.ReportOpt = None,
) -> None:
    """Measure prompt processing (pp) and generation (tg) speed, as llama-bench does, for one or more models and settings;
    with --endpoint, load-test an OpenAI-compatible server as vLLM's bench serve does."""
    load_flags = (rate, requests, burstiness, max_concurrency, input_len, output_len, dataset, slo, percentiles, sweep, report)
    if endpoint or lt.asked(*load_flags):  # the load test: cli/loadtest.py, nothing loaded here
        local_only = [f for f, v in (("-p", n_prompt), ("-n", n_gen), ("--pg", pg), ("-d", depth), ("--parallel", parallel),
                                     ("-t", threads), ("-c", ctx_size), ("-ngl", gpu_layers), ("-b", batch_size),
                                     ("--json-schema/--grammar/--format", response_format)) if v]  # fmt: skip
        return lt.run(
            endpoint, model=model, rate=rate, requests=requests, burstiness=burstiness,
            max_concurrency=max_concurrency, input_len=input_len, output_len=output_len, dataset=dataset, slo=slo,
            percentiles=percentiles, sweep=sweep, report=report, seed=seed, output=output.value, no_log=flags.no_log,
            quiet=quiet, local_only=local_only,
        )  # fmt: skip
    with handle_errors():
        if draft is not None:  # one sequence at a time only, for now (generate.drafting)
            draft.single_sequence("bench")
        from localinfer.bench import method as core
        from localinfer.bench.sweep import run_bench
        from localinfer.usage import history
        from localinfer.render.bench import BenchWriter
        from localinfer.render.stats import warn
        from localinfer.render.progress import make_progress
        from localinfer.store import resolve_model

        tests = core.expand_tests(
            _ints("--n-prompt", n_prompt, (512,)),
            _ints("--n-gen", n_gen, (128,)),
            _pairs(pg),
            _ints("--depth", depth, (0,)),
        )
        configs = [
            dataclasses.replace(base, n_ctx=c, n_threads=t, n_gpu_layers=o.parse_gpu_layers(g), n_batch=b)
            for g in _gpu_layer_values(gpu_layers)
            for t in _ints("--threads", threads, (None,), minimum=1)
            for c in _ints("--ctx-size", ctx_size, (None,), minimum=16)
            for b in _ints("--batch-size", batch_size, (2048,), minimum=1)
        ]
        parallel_levels = _ints("--parallel", parallel, (), minimum=1)
        if parallel_levels and response_format is not None:
            from localinfer.errors import UsageError

            raise UsageError("--json-schema, --grammar and --format measure pp/tg tests, not --parallel")
        if parallel_levels:  # each a prompt and a generation, served N at a time
            tests = _shapes(n_prompt, n_gen, pg)
        resolved = [resolve_model(m, offline=flags.offline, pull_progress=make_progress()) for m in _models(model)]
        say = _progress_sink(quiet=quiet, forced=progress)
        writer = BenchWriter(output.value, pricing)
        log = history.logging_enabled(flags.no_log)
        record = _parallel_record if parallel_levels else _record
        current = None
        try:
            for result in run_bench(
                resolved, configs, tests, repetitions, warmup=not no_warmup, seed=seed, progress=say, force=flags.force,
                constraint=response_format, parallel=parallel_levels, draft=draft.kind if draft is not None else None,
            ):
                current = result.model
                writer.add(result.to_json(pricing))
                if log:
                    history.append(record(result), warn=warn)
        except BaseException as exc:
            if log and resolved:
                model_name = current.name if current is not None else resolved[0].name
                history.append(history.UsageRecord(
                    command="bench", model=model_name,
                    model_sha256=next((r.sha256 for r in resolved if r.name == model_name), None),
                    exit_status=history.exit_status_of(exc),
                    finish_reason="interrupted" if isinstance(exc, KeyboardInterrupt) else "error",
                ), warn=warn)
            raise
        finally:
            if say is not None:
                say.close()
            writer.finish()


def _gpu_layer_values(values: list[str] | None) -> list[str]:
    return [p.strip() for v in values or ("auto",) for p in v.split(",") if p.strip()] or ["auto"]


def _record(result):
    """One history row per bench result: the tokens it processed and its mean rate."""
    from localinfer.usage import history

    t, reps = result.test, len(result.reps)
    return history.UsageRecord(
        command="bench",
        model=result.model.name,
        model_sha256=result.model.sha256,
        prompt_tokens=(t.depth + t.n_prompt) * reps,
        prompt_eval_tokens=t.n_prompt * reps,
        cached_tokens=t.depth * reps,
        completion_tokens=t.n_gen * reps,
        prefill_tps=result.avg_ts if t.kind == "pp" else None,
        decode_tps=result.avg_ts if t.kind == "tg" else None,
        total_ms=sum(r.seconds for r in result.reps) * 1000.0,
        finish_reason="length",
        extra={
            "test": t.name, "reps": reps, "avg_ts": result.avg_ts, "stddev_ts": result.stddev_ts,
            "raw_avg_ts": result.raw_avg_ts, "n_threads": result.n_threads, "n_ctx": result.n_ctx,
            "n_batch": result.n_batch, "n_gpu_layers": result.options.n_gpu_layers,
        },
    )


def _shapes(n_prompt, n_gen, pg):
    from localinfer.bench.parallel import shapes_for

    return shapes_for(_ints("--n-prompt", n_prompt, (512,)), _ints("--n-gen", n_gen, (128,)), _pairs(pg))


def _parallel_record(result):
    """One history row per --parallel result: all the sequences' tokens, the aggregate rate."""
    from localinfer.usage import history

    reps = len(result.reps)
    return history.UsageRecord(
        command="bench",
        model=result.model.name,
        model_sha256=result.model.sha256,
        prompt_tokens=sum(r.prompt_tokens for r in result.reps),
        prompt_eval_tokens=sum(r.prompt_tokens for r in result.reps),
        completion_tokens=sum(r.gen_tokens for r in result.reps),
        total_ms=sum(r.wall_s for r in result.reps) * 1000.0,
        finish_reason="length",
        extra={"test": result.name, "reps": reps, "n_parallel": result.n_parallel, "n_threads": result.n_threads},
    )


class _BenchStatus:
    """Progress on stderr: a transient status line on a terminal, plain lines otherwise."""

    def __init__(self, tty: bool) -> None:
        self._status = None
        if tty:
            from rich.console import Console

            self._status = Console(file=sys.stderr).status("bench: starting")
            self._status.start()

    def __call__(self, message: str) -> None:
        if self._status is not None:
            self._status.update(f"bench: {message}")
        else:
            sys.stderr.write(f"bench: {message}\n")
            sys.stderr.flush()

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


def _progress_sink(*, quiet: bool, forced: bool) -> _BenchStatus | None:
    from localinfer.render.term import is_tty, styled

    if quiet:
        return None
    if is_tty(sys.stderr) or forced:
        return _BenchStatus(tty=styled(sys.stderr))  # NO_COLOR or not a terminal: plain lines
    return None


def register(app: typer.Typer) -> None:
    app.command(name="bench")(bench)
