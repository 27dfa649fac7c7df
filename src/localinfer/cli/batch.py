"""`localinfer batch`: a file of requests in, one JSON result per request out, several at a time."""


import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from localinfer.cli import options as o
from localinfer.cli.common import handle_errors


OnError = o.choices("OnError", "skip", "abort")
InputFormat = o.choices("InputFormat", "auto", "jsonl", "text")


_JOB = "Batch job"

ParallelOpt = Annotated[
    Optional[int],
    typer.Option("--parallel", "-np", min=1, max=256, help="Sequences decoded together. Default: from cores and memory (8 on 2 cores).", rich_help_panel=_JOB),
]
CtxPerSeqOpt = Annotated[
    Optional[int],
    typer.Option("--ctx-size", "-c", min=16, help="Context window of each request, in tokens. Default: the model's trained context, at most 4096.", rich_help_panel=o._CONTEXT),
]


def _read_input(source: str) -> bytes:
    from localinfer.errors import UsageError
    from localinfer.request.limits import BATCH_INPUT_MAX_BYTES, read_limited

    if source == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError("no input on stdin", hint="pipe requests in, or pass a file: localinfer batch requests.jsonl")
        return read_limited(sys.stdin.buffer, BATCH_INPUT_MAX_BYTES, "the input on stdin")
    path = Path(source)
    if not path.is_file():
        raise UsageError(f"input file not found: {source}")
    with open(path, "rb") as fh:
        return read_limited(fh, BATCH_INPUT_MAX_BYTES, source)


@o.grouped
def batch(
    input: Annotated[str, typer.Argument(metavar="INPUT", help="JSONL (one request per line) or text (one prompt per line); - for stdin.", show_default=False)],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write results here (JSONL). Default: stdout.", rich_help_panel=_JOB)] = None,
    model: o.ModelOpt = None,
    parallel: ParallelOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="Skip ids already answered in --output; retry its errors.", rich_help_panel=_JOB)] = False,
    on_error: Annotated[OnError, typer.Option("--on-error", help="A bad line or a prompt too long: write an error record, or stop the job.", rich_help_panel=_JOB)] = OnError.skip,
    keep_order: Annotated[bool, typer.Option("--keep-order", help="Write results in input order (default: as they finish).", rich_help_panel=_JOB)] = False,
    input_format: Annotated[InputFormat, typer.Option("--input-format", help="Input format; auto looks at the extension, then the first line.", rich_help_panel=_JOB)] = InputFormat.auto,
    system: Annotated[Optional[str], typer.Option("--system", "-s", help="System prompt for 'prompt' requests.")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="'prompt' requests as plain completion: no chat template.")] = False,
    image_dir: Annotated[Optional[Path], typer.Option("--image-dir", metavar="DIR", help="Where the lines' image files are: image_url parts may name file://PATH, PATH relative to DIR (nothing outside it is read).", rich_help_panel=_JOB)] = None,
    sampling: o.Sampling = o.SAMPLING,
    template_vars: o.TemplateVars = o.TEMPLATE,
    max_tokens: o.MaxTokensOpt = None,
    stop: o.StopOpt = None,
    response_format: o.ResponseFormat = o.FORMAT,
    logprobs: o.Logprobs = o.LOGPROBS,
    on_overflow: Annotated[o.Overflow, typer.Option("--on-overflow", help="When a prompt does not fit: an error for that request, or keep its end.")] = o.Overflow.error,
    ctx_size: CtxPerSeqOpt = None,
    base: o.Load = o.LOAD.without("ctx_size"),
    draft: o.Drafting = o.DRAFT,
    flags: o.Common = o.COMMON.without("force"),
    endpoint: o.Server = o.SERVER,
    keep_alive: o.Keep = o.KEEP_ALIVE,
    retries: Annotated[int, typer.Option("--retries", min=0, help="With --endpoint: tries after the first when the server is busy (429/503) or the connection fails.", rich_help_panel=o._SERVER)] = 4,
) -> None:
    """Run many requests through one model, several sequences at a time; one JSON result per line.
    --json-schema, --grammar or --format json constrain every answer; a line's response_format overrides them."""
    with handle_errors():
        if draft is not None:  # one sequence at a time only, for now (generate.drafting)
            draft.single_sequence("batch")
        from localinfer.batch import io as batchio
        from localinfer.batch import job as batchjob
        from localinfer.errors import UsageError
        from localinfer.render.batch import make_progress, print_summary
        from localinfer.render.stats import warn

        say = (lambda msg: None) if flags.quiet else warn
        if draft is not None:  # each sequence drafts on its own (engine/batch_draft.py)
            base = draft.apply(base)
        if resume and output is None:
            raise UsageError("--resume needs --output FILE (the results to resume from)")
        if output is not None and input != "-" and output.exists() and output.resolve() == Path(input).resolve():
            raise UsageError("--output must not be the input file")
        if output is not None:
            batchio.check_output(output)
        if image_dir is not None and not image_dir.is_dir():
            raise UsageError(f"--image-dir {image_dir} is not a directory")
        items = batchio.parse_input(_read_input(input), input_format.value, name=input, image_dir=image_dir)
        batchjob.check_items(items, on_error.value)
        done = batchio.prepare_resume(output) if resume and output is not None else set()
        pending = [i for i in items if i.id is None or batchjob.id_key(i.id) not in done]
        summary = batchjob.BatchSummary(requests=len(items), skipped=len(items) - len(pending))
        if not pending:
            if output is not None and not resume:
                output.write_bytes(b"")
            if not flags.quiet:
                print_summary(summary)
            return
        from localinfer.cli.backend import open_backend

        def load_opts(resolved):
            nonlocal parallel
            ctx_per_seq = ctx_size or batchjob.default_ctx_per_seq(resolved)
            if parallel is None:
                parallel = _default_parallel(len(pending), resolved, ctx_per_seq, base)
            return batchjob.batch_load_options(base, parallel=parallel, ctx_per_seq=ctx_per_seq)

        if endpoint:  # a server's own slots decide its concurrency
            from localinfer.remote.batch import DEFAULT_PARALLEL

            parallel = parallel or DEFAULT_PARALLEL
        # a wrong URL or key, like a model that will not load, writes nothing: the output is opened after
        backend = open_backend(endpoint=endpoint, model=model, load_options=load_opts,
                               offline=flags.offline, on_note=say, pool=parallel or 1, retries=retries, keep_alive=keep_alive)  # fmt: skip
        assert parallel is not None
        try:
            if getattr(backend, "loaded", None) is not None:  # a template the sandbox refuses fails the job now
                batchjob.check_template(backend.loaded)
            if not backend.can_chat and not raw and any(isinstance(i, batchio.BatchRequest) and i.prompt is not None for i in pending):
                say(f"{backend.name} has no chat template; running prompts as plain completion (pass --raw to silence this)")
            if system and endpoint is None and any(isinstance(i, batchio.BatchRequest) and i.messages is not None for i in pending):
                say("--system applies to 'prompt' requests; 'messages' requests are used as given")

            defaults = batchjob.BatchDefaults(
                sampling=sampling,
                max_tokens=max_tokens, stop=tuple(stop or ()), system=system, raw=raw, on_overflow=on_overflow.value,
                response_format=response_format,
                template_vars=template_vars,
                logprobs=logprobs,
            )
            sink = batchio.JsonlSink(path=output, append=resume) if output is not None else batchio.JsonlSink(stream=sys.stdout.buffer)
            show = None if flags.quiet else make_progress(len(pending))
            from localinfer.usage.recorder import RequestLog

            log = RequestLog("batch", backend, no_log=flags.no_log, extra={"parallel": parallel}, warn=warn)
            try:
                batchjob.execute(
                    pending, backend, parallel, defaults, log.wrap(sink),
                    on_error=on_error.value, keep_order=keep_order, progress=show, summary=summary,
                )
            finally:
                sink.close()
                log.flush()
                if show is not None:
                    show.close()
                    print_summary(summary, backend.name if endpoint is None else f"{backend.name} @ {backend.endpoint}")
        finally:
            backend.close()


def _default_parallel(n_pending: int, resolved, ctx_per_seq: int, base) -> int:
    import psutil

    from localinfer.batch import job as batchjob
    from localinfer.engine.backend import default_threads

    per_token = batchjob.kv_bytes_per_token(resolved, base.cache_type_k, base.cache_type_v)
    available = max(0, psutil.virtual_memory().available - resolved.info.file_size)
    return batchjob.default_parallel(
        n_pending,
        kv_bytes_per_seq=per_token * ctx_per_seq if per_token else None,
        available_bytes=available,
        physical_cores=default_threads(),
        gpu=base.n_gpu_layers != 0,
    )


def register(app: typer.Typer) -> None:
    app.command(name="batch")(batch)
