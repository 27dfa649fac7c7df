"""`localinfer embed`: texts in (lines or JSONL), one JSON line per input out: id, embedding, tokens."""


import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from localinfer.cli import options as o
from localinfer.cli.common import handle_errors

_EMBED = "Embeddings"
Pooling = o.choices("Pooling", "mean", "cls", "last")
InputFormat = o.choices("EmbedFormat", "auto", "text", "jsonl")
GENERATION_CTX = 256  # the generation context every load makes: embed never generates, so the smallest

EmbedCtxOpt = Annotated[
    Optional[int],
    typer.Option("--ctx-size", "-c", min=16, help="Embedding context: tokens per llama_decode, and so the longest input. Default: 512 (at most the trained context).", rich_help_panel=o._CONTEXT),
]


def _read(source: str) -> bytes:
    import contextlib

    from localinfer.errors import UsageError
    from localinfer.request.limits import BATCH_INPUT_MAX_BYTES, read_limited

    stdin = source == "-"
    if stdin and (sys.stdin is None or sys.stdin.isatty()):
        raise UsageError("no input on stdin", hint="pipe texts in (one per line), or pass a file: localinfer embed texts.txt")
    if not stdin and not Path(source).is_file():
        raise UsageError(f"input file not found: {source}")
    with contextlib.nullcontext(sys.stdin.buffer) if stdin else open(source, "rb") as fh:
        return read_limited(fh, BATCH_INPUT_MAX_BYTES, "the input on stdin" if stdin else source)


@o.grouped
def embed(
    input: Annotated[str, typer.Argument(metavar="[FILE|-]", help="Text lines, or JSONL ({\"id\", \"text\"} or \"input\"); - or nothing: stdin.", show_default=False)] = "-",
    model: o.ModelOpt = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the JSONL here. Default: stdout.", rich_help_panel=_EMBED)] = None,
    normalize: Annotated[bool, typer.Option("--normalize/--no-normalize", help="L2-normalize each vector (as OpenAI's API does).", rich_help_panel=_EMBED)] = True,
    pooling: Annotated[Optional[Pooling], typer.Option("--pooling", help="How token vectors become one. Default: the GGUF's pooling_type, else mean.", rich_help_panel=_EMBED, show_default=False)] = None,
    truncate: Annotated[bool, typer.Option("--truncate", help="Cut an input longer than the context to fit (else it gets an error record).", rich_help_panel=_EMBED)] = False,
    input_format: Annotated[InputFormat, typer.Option("--input-format", help="Input format (as batch's); auto: JSONL if the first line starts with '{'.", rich_help_panel=_EMBED)] = InputFormat.auto,
    ctx_size: EmbedCtxOpt = None,
    base: o.Load = o.LOAD.without("ctx_size"),
    flags: o.Common = o.COMMON,
    endpoint: o.Server = o.SERVER,
) -> None:
    """Embed texts (one vector per line) with a local model or a server's /v1/embeddings."""
    with handle_errors():
        import dataclasses

        from localinfer.embed import embedding
        from localinfer.batch import io as batchio
        from localinfer.cli.backend import open_backend
        from localinfer.render.embed import EmbedProgress, print_summary
        from localinfer.render.stats import warn
        from localinfer.usage.recorder import record_embeddings

        say = (lambda msg: None) if flags.quiet else warn
        if output is not None:
            batchio.check_output(output)
        items = embedding.parse_lines(_read(input), input_format.value)
        backend = open_backend(endpoint=endpoint, model=model, offline=flags.offline, force=flags.force, on_note=say,
                               load_options=lambda _resolved: dataclasses.replace(base, n_ctx=GENERATION_CTX), chat=False)  # fmt: skip
        t0 = time.perf_counter()
        summary, status = embedding.EmbedSummary(inputs=len(items)), 1
        try:
            sink = batchio.JsonlSink(path=output) if output is not None else batchio.JsonlSink(stream=sys.stdout.buffer)
            try:
                summary = embedding.run(items, backend, sink, normalize=normalize, pooling=pooling.value if pooling else None,
                                        truncate=truncate, n_ctx=ctx_size, on_done=None if flags.quiet else EmbedProgress(len(items)))  # fmt: skip
                status = 0
            finally:
                sink.close()
        finally:
            wall = time.perf_counter() - t0
            record_embeddings("embed", backend, inputs=summary.inputs, embedded=summary.embedded, tokens=summary.tokens,
                              total_s=wall, load_s=getattr(backend, "load_s", None), exit_status=status, no_log=flags.no_log, warn=warn)  # fmt: skip
            backend.close()
        if not flags.quiet:
            print_summary(summary, wall, backend.name if endpoint is None else f"{backend.name} @ {backend.endpoint}")


def register(app: typer.Typer) -> None:
    app.command(name="embed")(embed)
