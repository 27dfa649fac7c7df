"""`localinfer run`: one prompt in, the answer streamed to stdout, the measurements on stderr."""


import sys
from typing import Annotated, Any, Optional

import typer

from localinfer.cli import options as o
from localinfer.cli.common import handle_errors


def read_piped_stdin(n_ctx: int | None = None, *, keep_tail: bool = False, remote: bool = False) -> str | None:
    """Text piped on stdin, or None when stdin is a terminal or absent (never waits for a TTY).

    Checked like every input: not UTF-8 is a usage error naming the byte; more than a context of
    ``n_ctx`` tokens can hold (limits.piped_limit) is refused before it is all read and tokenized,
    or with ``keep_tail`` (--on-overflow truncate) only its end is kept."""
    from localinfer.request import limits

    stream = sys.stdin
    if stream is None:
        return None
    try:
        if stream.isatty():
            return None
        raw = stream.buffer
    except (OSError, ValueError, AttributeError):
        return None
    from localinfer.errors import ContextOverflowError, UsageError

    if remote:
        limit, why, too_big = limits.PIPED_REMOTE_MAX_BYTES, "", UsageError
    else:  # more than the context can hold: the same refusal (exit 6) as a prompt found too long
        limit, too_big = limits.piped_limit(n_ctx), ContextOverflowError
        tokens = n_ctx or limits.PIPED_DEFAULT_CTX
        why = f", more than a {tokens}-token context can hold (at {limits.PIPED_BYTES_PER_TOKEN} bytes a token)"
    try:
        text = limits.read_text(raw, limit, "the input on stdin", keep_tail=keep_tail, why=why, too_big=too_big)
    except (OSError, ValueError):  # unreadable or closed: as if nothing was piped
        return None
    return text or None


def _write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@o.grouped
def run(
    prompt_words: Annotated[Optional[list[str]], typer.Argument(metavar="PROMPT", help="Prompt (or use --prompt).", show_default=False)] = None,
    prompt: Annotated[Optional[str], typer.Option("--prompt", "-p", help="The prompt. Piped stdin is added before it as context.")] = None,
    model: o.ModelOpt = None,
    system: o.SystemOpt = None,
    sampling: o.Sampling = o.SAMPLING,
    max_tokens: o.MaxTokensOpt = None,
    stop: o.StopOpt = None,
    ignore_eos: o.IgnoreEosOpt = False,
    load_opts: o.Load = o.LOAD,
    draft: o.Drafting = o.DRAFT,
    force: o.ForceOpt = False,
    raw: Annotated[bool, typer.Option("--raw", help="Plain completion: no chat template.")] = False,
    on_overflow: Annotated[o.Overflow, typer.Option("--on-overflow", help="When the prompt does not fit: fail, or keep its end.")] = o.Overflow.error,
    offline: o.OfflineOpt = False,
    no_log: o.NoLogOpt = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object (text, reasoning, usage, timings) instead of streaming.")] = False,
    logprobs: o.Logprobs = o.LOGPROBS,
    template_vars: o.TemplateVars = o.TEMPLATE,
    hide_thinking: Annotated[bool, typer.Option("--hide-thinking", help="Do not show a reasoning model's thinking (shown dim on stderr on a terminal; never on stdout).")] = False,
    show_prompt: Annotated[bool, typer.Option("--show-prompt", "--verbose-prompt", help="Print the exact prompt the chat template built, and its token count, on stderr.")] = False,
    quiet: o.QuietOpt = False,
    verbose: o.VerboseOpt = False,
    endpoint: o.Server = o.SERVER,
    response_format: o.ResponseFormat = o.FORMAT,
    keep_alive: o.Keep = o.KEEP_ALIVE,
    image: Annotated[Optional[list[str]], typer.Option("--image", metavar="FILE", help="An image for a vision model (repeatable): before the text, or where the prompt writes <__media__>. PNG, JPEG, WebP, GIF, BMP; no URLs.", show_default=False)] = None,
) -> None:
    """Run a prompt and stream the answer to stdout; stats go to stderr. With --json-schema, --grammar
    or --format json, stdout is exactly the document (and a newline)."""
    from localinfer.render.stats import warn as warn_line
    from localinfer.usage.recorder import recording

    with handle_errors(), recording("run", no_log=no_log, warn=warn_line) as rec:
        from localinfer.api import DEFAULT_COMPLETION_TOKENS
        from localinfer.errors import UsageError

        if logprobs is not None and not json_out:  # streamed text has no room for them
            raise UsageError("--logprobs needs --json (they are the JSON's 'logprobs' list)")
        from localinfer.cli.backend import open_backend
        from localinfer.render.stats import warn
        from localinfer.request.images import read_files

        load_opts = draft.apply(load_opts) if draft is not None else load_opts
        # checked before anything is loaded or sent; read no further than the context can hold
        bound = {"remote": True} if endpoint else {"n_ctx": load_opts.n_ctx, "keep_tail": on_overflow.value == "truncate"}
        text = _prompt_text(prompt_words, prompt, **bound)
        rec.prompt_text = text
        pictures = read_files(image or [])  # read and checked before a model is loaded (or a server asked)
        say = (lambda msg: None) if quiet else warn

        def on_model(named: Any) -> None:
            rec.model = named

        backend = open_backend(endpoint=endpoint, model=model, load_options=lambda _resolved: load_opts,
                               offline=offline, force=force, on_note=say, on_model=on_model, keep_alive=keep_alive,
                               chat=not raw)  # fmt: skip
        # Not freed piece by piece as the process ends (engine.model.LlamaModel.__del__); only the last
        # run's: a process running the command again (CliRunner) frees the one before.
        _until_exit[:] = [backend]
        try:
            if not raw and not backend.can_chat:
                say(f"{backend.name} has no chat template; running plain completion (pass --raw to silence this)")

            request = backend.request(
                text, system=system, raw=raw, max_tokens=max_tokens, default_max_tokens=DEFAULT_COMPLETION_TOKENS,
                stop=tuple(stop or ()), on_overflow=on_overflow.value, sampling=sampling, ignore_eos=ignore_eos,
                response_format=response_format, chat_template_kwargs=template_vars,
                logprobs=logprobs,
            )  # fmt: skip
            if pictures:
                from localinfer.request.images import attach

                request = attach(request, pictures)
            if show_prompt:
                _show_prompt(backend, request, say)
            from localinfer.render.thinking import ThinkingWriter, shows_thinking

            thinking = ThinkingWriter() if shows_thinking(hide_thinking or quiet or json_out) else None
            result = _stream(backend, request, json_out=json_out, quiet=quiet, verbose=verbose, thinking=thinking)
            rec.result = result
            if json_out:

                from localinfer.answer.finite import dumps as finite_dumps  # NaN logprobs as null

                _write_stdout(finite_dumps(result.to_json(), ensure_ascii=False) + "\n")
            elif result.text and not result.text.endswith("\n"):
                _write_stdout("\n")
            if request.raw_text is not None and max_tokens is None and result.finish_reason == "length":
                n = request.default_max_tokens
                if n is not None and (result.completion_tokens or 0) >= n:
                    say(f"plain completion stopped at its default limit of {n} tokens; -n sets another")
            if response_format is not None and _incomplete(result):
                what = "it does not complete the grammar" if response_format.kind == "grammar" else "the JSON is incomplete"
                say(f"the answer stopped ({result.finish_reason}) before the end of the document: {what}")
            if result.truncated_tokens:
                say(f"the prompt was truncated: its first {result.truncated_tokens} tokens were dropped to fit the context")
            if not quiet:
                _print_summary(result, verbose)
        finally:
            if backend.endpoint is not None:  # a server's connections (a model here stays: see above)
                backend.close()


_until_exit: list = []


def _incomplete(answer: Any) -> bool:
    """The constrained document did not end (the engine's verdict; a server's: cut by its length)."""
    if answer.stats is not None:
        return answer.stats.document == "incomplete"
    return answer.finish_reason == "length"


def _prompt_text(prompt_words: list[str] | None, prompt: str | None, **stdin: Any) -> str:
    """The prompt from the arguments or --prompt, after any piped stdin (as context; ``stdin``:
    how much of it to read, see read_piped_stdin)."""
    from localinfer.generate import run as generate
    from localinfer.errors import UsageError

    if prompt_words and prompt:
        raise UsageError("give the prompt either as an argument or with --prompt, not both")
    return generate.combine_stdin_and_prompt(read_piped_stdin(**stdin), prompt or " ".join(prompt_words or []) or None)


def _print_summary(answer: Any, verbose: bool) -> None:
    if answer.backend is not None:  # a server's answer: what it did not report reads "unknown"
        from localinfer.render.remote import print_summary
    else:
        from localinfer.render.stats import print_summary
    print_summary(answer, verbose=verbose)


def _show_prompt(backend: Any, request: Any, say: Any) -> None:
    """--show-prompt: the prompt as the model gets it, on stderr (stdout carries only the answer)."""
    shown = backend.prompt_text(request)
    if shown is None:
        say("--show-prompt: the server builds the prompt with --endpoint; nothing to show here")
        return
    text, n_tokens = shown
    sys.stderr.write(f"--- prompt ({n_tokens} tokens) ---\n{text}\n--- end of prompt ---\n")
    sys.stderr.flush()


def _stream(backend: Any, request: Any, *, json_out: bool, quiet: bool, verbose: bool, thinking: Any = None) -> Any:
    """Stream the answer to stdout (unless ``json_out``) and the thinking to ``thinking`` (a
    ThinkingWriter, or None: not shown); its Answer. On Ctrl-C, the answer so far ends its line
    and its stats are shown before the interruption is reported."""

    def write(text: str) -> None:
        if thinking is not None:
            thinking.end()
        _write_stdout(text)

    try:
        try:
            return backend.answer(request, None if json_out else write, on_reasoning=thinking.write if thinking else None)
        finally:
            if thinking is not None:
                thinking.end()
    except KeyboardInterrupt as exc:
        from localinfer.errors import Interrupted

        partial = exc.partial if isinstance(exc, Interrupted) else None  # its stats settled for what was generated
        if partial is not None and partial.text and not json_out:
            _write_stdout("\n")
        if partial is not None and not quiet:
            _print_summary(partial, verbose)
        raise


def register(app: typer.Typer) -> None:
    app.command(name="run")(run)
