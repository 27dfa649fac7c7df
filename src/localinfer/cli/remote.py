"""`run`, `chat` and `batch` with ``--endpoint``: the flags of the local command translated into a
request to an OpenAI-compatible server (``localinfer.remote``). Each command hands off here near the
top of its body; without ``--endpoint`` nothing here is imported."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from localinfer.cli.common import handle_errors

if TYPE_CHECKING:
    from pathlib import Path

    from localinfer.batch.job import BatchDefaults, BatchSummary
    from localinfer.engine.types import SamplingOptions
    from localinfer.remote.client import Client
    from localinfer.remote.connection import Endpoint


def connect(ep: Endpoint, *, pool: int = 10) -> Client:
    """A client for ``--endpoint`` (checked by its option group: a bad URL fails before anything is sent)."""
    from localinfer.remote.client import Client

    return Client(ep, pool=pool)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def run(
    ep: Endpoint, *, text: Callable[[], str], model: str | None,
    system: str | None, sampling: SamplingOptions, max_tokens: int | None, stop: Sequence[str], ignore_eos: bool,
    raw: bool, json_out: bool, quiet: bool, verbose: bool, no_log: bool,
) -> None:  # fmt: skip
    """`run --endpoint`: stream one answer from the server, as `run` does from a local model."""
    from localinfer.generate import messages_for
    from localinfer.remote import client as rc
    from localinfer.remote.results import usage_record
    from localinfer.render.stats import warn
    from localinfer.usage import history

    with handle_errors():
        prompt = text()  # the prompt is checked before anything is sent
        client = connect(ep, pool=1)
        name, result, exc_seen = model, None, None
        try:
            name = client.pick_model(model)
            body = rc.request_body(name, sampling=sampling, max_tokens=max_tokens, stop=stop, ignore_eos=ignore_eos,
                                   **({"prompt": prompt} if raw else {"messages": messages_for(prompt, system)}))  # fmt: skip
            result = _answer(client, body, name, "raw" if raw else "chat", sampling.seed, json_out=json_out,
                             quiet=quiet, verbose=verbose)  # fmt: skip
        except BaseException as exc:
            exc_seen = exc
            raise
        finally:
            client.close()
            if history.logging_enabled(no_log) and name is not None:  # as locally: once a model is named
                reason = None if result is not None else ("interrupted" if isinstance(exc_seen, KeyboardInterrupt) else "error")
                history.append(usage_record("run", result, model=name, endpoint=client.ep.display, finish_reason=reason,
                                            exit_status=history.exit_status_of(exc_seen), prompt_text=prompt),
                               warn=warn)  # fmt: skip


def _answer(client: Client, body: dict[str, Any], name: str, mode: str, seed: int | None, *, json_out: bool,
            quiet: bool, verbose: bool) -> Any:  # fmt: skip
    """Stream the answer to stdout (or print it as one JSON object), then the stats line; on Ctrl-C,
    the answer so far ends its line and its stats are shown before the interruption is reported."""
    from localinfer.remote.results import RemoteResult
    from localinfer.render.remote import print_summary

    try:
        outcome = client.stream(body, on_text=None if json_out else _write)
    except KeyboardInterrupt as exc:
        partial = getattr(exc, "partial_outcome", None)
        if partial is not None and partial.text and not json_out:
            _write("\n")
        if partial is not None and not quiet:
            print_summary(RemoteResult(partial, name, client.ep.display, mode, seed), verbose=verbose)
        raise
    result = RemoteResult(outcome, name, client.ep.display, mode, seed)
    if json_out:
        import json

        _write(json.dumps(result.to_json(), ensure_ascii=False) + "\n")
    elif outcome.text and not outcome.text.endswith("\n"):
        _write("\n")
    if not quiet:
        print_summary(result, verbose=verbose)
    return result


def chat(
    ep: Endpoint, *, model: str | None, system: str | None,
    sampling: SamplingOptions, max_tokens: int | None, stop: Sequence[str], quiet: bool, verbose: bool, no_log: bool,
    lines: Callable[[], Any],
) -> None:  # fmt: skip
    """`chat --endpoint`: the same session over a server (a REPL on a terminal, lines when piped)."""
    import typer

    from localinfer.chat.settings import ChatSettings
    from localinfer.cli.chat_repl import run_lines, run_repl
    from localinfer.engine.types import LoadOptions
    from localinfer.remote.chat import RemoteChatSession
    from localinfer.render.term import is_tty

    failed = 0
    with handle_errors():
        interactive = is_tty(sys.stdin) and is_tty(sys.stdout)
        session = RemoteChatSession(load_opts=LoadOptions(), offline=True, force=False, quiet=quiet, verbose=verbose,
                                    no_log=no_log, interactive=interactive)  # fmt: skip
        session.client = connect(ep, pool=1)
        try:
            session.open(model, system, ChatSettings(sampling=sampling, max_tokens=max_tokens, stop=tuple(stop)))
            if interactive:
                run_repl(session)
            else:
                failed = run_lines(session, lines())
        finally:
            session.client.close()
    if failed:
        raise typer.Exit(failed)


def batch(
    ep: Endpoint, *, retries: int, model: str | None, pending: Sequence[Any],
    summary: BatchSummary, output: Path | None, resume: bool, parallel: int | None, defaults: BatchDefaults,
    on_error: str, keep_order: bool, quiet: bool, no_log: bool,
) -> None:  # fmt: skip
    """`batch --endpoint`: the pending requests to the server (the input was read and checked, and
    ``--resume`` applied, by the command, exactly as for a local job)."""
    from localinfer.batch import io as batchio
    from localinfer.remote import batch as rb
    from localinfer.render.batch import make_progress, print_summary
    from localinfer.render.stats import warn

    parallel = parallel or rb.DEFAULT_PARALLEL
    client = connect(ep, pool=parallel)
    try:
        name = client.pick_model(model)  # before the output is opened: a wrong URL or key writes nothing
        sink = batchio.JsonlSink(path=output, append=resume) if output is not None else batchio.JsonlSink(stream=sys.stdout.buffer)
        show = None if quiet else make_progress(len(pending))
        log = rb.RemoteRequestLog("batch", name, client.ep.display, no_log=no_log, extra={"parallel": parallel}, warn=warn)
        try:
            rb.execute(pending, client, name, parallel, defaults, log.wrap(sink), on_error=on_error,
                       keep_order=keep_order, progress=show, summary=summary, policy=rb.RetryPolicy(retries=retries))  # fmt: skip
        finally:
            sink.close()
            log.flush()
            if show is not None:
                show.close()
                print_summary(summary, f"{name} @ {client.ep.display}")
    finally:
        client.close()
