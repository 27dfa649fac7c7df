"""`localinfer run`: one prompt in, the answer streamed to stdout, the measurements on stderr."""


import sys
from typing import Annotated, Any, Optional

import typer

from localinfer.cli import options as o
from localinfer.cli.common import handle_errors


def read_piped_stdin() -> str | None:
    """Text piped on stdin, or None when stdin is a terminal or absent (never waits for a TTY)."""
    stream = sys.stdin
    if stream is None:
        return None
    try:
        if stream.isatty():
            return None
        data = stream.buffer.read()
    except (OSError, ValueError):
        return None
    return data.decode("utf-8", errors="replace") if data else None


def _write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def run(
    prompt_words: Annotated[Optional[list[str]], typer.Argument(metavar="PROMPT", help="Prompt (or use --prompt).", show_default=False)] = None,
    prompt: Annotated[Optional[str], typer.Option("--prompt", "-p", help="The prompt. Piped stdin is added before it as context.")] = None,
    model: o.ModelOpt = None,
    system: o.SystemOpt = None,
    temperature: o.TemperatureOpt = o.DEFAULTS.temperature,
    top_p: o.TopPOpt = o.DEFAULTS.top_p,
    top_k: o.TopKOpt = o.DEFAULTS.top_k,
    min_p: o.MinPOpt = o.DEFAULTS.min_p,
    repeat_penalty: o.RepeatPenaltyOpt = o.DEFAULTS.repeat_penalty,
    seed: o.SeedOpt = None,
    max_tokens: o.MaxTokensOpt = None,
    stop: o.StopOpt = None,
    ignore_eos: o.IgnoreEosOpt = False,
    ctx_size: o.CtxSizeOpt = None,
    threads: o.ThreadsOpt = None,
    gpu_layers: o.GpuLayersOpt = "auto",
    flash_attn: o.FlashAttnOpt = "auto",
    cache_type_k: o.CacheTypeKOpt = "f16",
    cache_type_v: o.CacheTypeVOpt = "f16",
    no_mmap: o.NoMmapOpt = False,
    mlock: o.MlockOpt = False,
    batch_size: o.BatchSizeOpt = 2048,
    cpu_repack: o.CpuRepackOpt = None,
    rpc: o.RpcOpt = None,
    force: o.ForceOpt = False,
    raw: Annotated[bool, typer.Option("--raw", help="Plain completion: no chat template.")] = False,
    on_overflow: Annotated[o.Overflow, typer.Option("--on-overflow", help="When the prompt does not fit: fail, or keep its end.")] = o.Overflow.error,
    offline: o.OfflineOpt = False,
    no_log: o.NoLogOpt = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object (text, usage, timings) instead of streaming.")] = False,
    quiet: o.QuietOpt = False,
    verbose: o.VerboseOpt = False,
    endpoint: o.EndpointOpt = None,
    api_key: o.ApiKeyOpt = None,
    timeout: o.TimeoutOpt = None,
) -> None:
    """Run a prompt and stream the answer to stdout; stats go to stderr."""
    from localinfer.usage.recorder import recording

    with handle_errors(), recording("run", no_log=no_log) as rec:
        from localinfer.api import DEFAULT_COMPLETION_TOKENS
        from localinfer.cli.backend import open_backend
        from localinfer.render.stats import warn

        text = _prompt_text(prompt_words, prompt)  # checked before anything is loaded or sent
        rec.prompt_text = text
        say = (lambda msg: None) if quiet else warn
        sampling = o.sampling_options(
            temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, repeat_penalty=repeat_penalty, seed=seed
        )

        def load_opts(_resolved: Any) -> Any:
            return o.load_options(
                ctx_size=ctx_size,
                threads=threads,
                gpu_layers=gpu_layers,
                verbose=verbose,
                flash_attn=flash_attn,
                cache_type_k=cache_type_k,
                cache_type_v=cache_type_v,
                no_mmap=no_mmap,
                mlock=mlock,
                batch_size=batch_size,
                cpu_repack=cpu_repack,
                rpc=rpc,
            )

        def on_model(named: Any) -> None:
            rec.model = named

        backend = open_backend(endpoint=endpoint, api_key=api_key, timeout=timeout, model=model, load_options=load_opts,
                               offline=offline, force=force, on_note=say, on_model=on_model)  # fmt: skip
        # Not freed piece by piece as the process ends (engine.model.Model.__del__); only the last
        # run's: a process running the command again (CliRunner) frees the one before.
        _until_exit[:] = [backend]
        try:
            if not raw and not backend.can_chat:
                say(f"{backend.name} has no chat template; running plain completion (pass --raw to silence this)")

            request = backend.request(
                text, system=system, raw=raw, max_tokens=max_tokens, default_max_tokens=DEFAULT_COMPLETION_TOKENS,
                stop=tuple(stop or ()), on_overflow=on_overflow.value, sampling=sampling, ignore_eos=ignore_eos,
            )  # fmt: skip
            result = _stream(backend, request, json_out=json_out, quiet=quiet, verbose=verbose)
            rec.result = result
            if json_out:
                import json

                _write_stdout(json.dumps(result.to_json(), ensure_ascii=False) + "\n")
            elif result.text and not result.text.endswith("\n"):
                _write_stdout("\n")
            if request.raw_text is not None and max_tokens is None and result.finish_reason == "length":
                n = request.default_max_tokens
                if n is not None and (result.completion_tokens or 0) >= n:
                    say(f"plain completion stopped at its default limit of {n} tokens; -n sets another")
            if result.truncated_tokens:
                say(f"the prompt was truncated: its first {result.truncated_tokens} tokens were dropped to fit the context")
            if not quiet:
                _print_summary(result, verbose)
        finally:
            if backend.endpoint is not None:  # a server's connections (a model here stays: see above)
                backend.close()


_until_exit: list = []


def _prompt_text(prompt_words: list[str] | None, prompt: str | None) -> str:
    """The prompt from the arguments or --prompt, after any piped stdin (as context)."""
    from localinfer import generate
    from localinfer.errors import UsageError

    if prompt_words and prompt:
        raise UsageError("give the prompt either as an argument or with --prompt, not both")
    return generate.combine_stdin_and_prompt(read_piped_stdin(), prompt or " ".join(prompt_words or []) or None)


def _print_summary(answer: Any, verbose: bool) -> None:
    if answer.backend is not None:  # a server's answer: what it did not report reads "unknown"
        from localinfer.render.remote import print_summary
    else:
        from localinfer.render.stats import print_summary
    print_summary(answer, verbose=verbose)


def _stream(backend: Any, request: Any, *, json_out: bool, quiet: bool, verbose: bool) -> Any:
    """Stream the answer to stdout (unless ``json_out``); its Answer. On Ctrl-C, the answer so far
    ends its line and its stats are shown before the interruption is reported."""
    try:
        return backend.answer(request, None if json_out else _write_stdout)
    except KeyboardInterrupt as exc:
        partial = getattr(exc, "partial_answer", None)  # the engine settled its stats for what was generated
        if partial is not None and partial.text and not json_out:
            _write_stdout("\n")
        if partial is not None and not quiet:
            _print_summary(partial, verbose)
        raise


def register(app: typer.Typer) -> None:
    app.command(name="run")(run)
