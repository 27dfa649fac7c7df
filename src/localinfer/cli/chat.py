"""`localinfer chat`: a conversation with a model. A REPL (prompt_toolkit) on a terminal; when stdin or
stdout is not a terminal, each input line is a user turn and only the answers go to stdout.

The session (slash commands, turns, what is printed) is cli.chat_session, the same on a model here and
on a server (--endpoint); this module translates the flags and picks the input loop (cli.chat_repl).
"""

from __future__ import annotations

import io
import sys
from typing import TextIO

import typer

from localinfer.cli import options as o
from localinfer.cli.common import handle_errors


def chat(
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
    offline: o.OfflineOpt = False,
    no_log: o.NoLogOpt = False,
    quiet: o.QuietOpt = False,
    verbose: o.VerboseOpt = False,
    endpoint: o.EndpointOpt = None,
    api_key: o.ApiKeyOpt = None,
    timeout: o.TimeoutOpt = None,
) -> None:
    """Chat with a model: a REPL on a terminal (/help lists its commands); piped, each line is a turn."""
    with handle_errors():

        def load_opts():
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

        sampling = o.sampling_options(
            temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, repeat_penalty=repeat_penalty, seed=seed
        )
        from localinfer.chat.settings import ChatSettings
        from localinfer.cli.chat_repl import run_lines, run_repl
        from localinfer.cli.chat_session import ChatSession

        settings = ChatSettings(sampling=sampling, max_tokens=max_tokens, stop=tuple(stop or ()))
        from localinfer.render.term import is_tty

        interactive = is_tty(sys.stdin) and is_tty(sys.stdout)
        session = ChatSession(
            load_opts=load_opts,
            offline=offline,  # with HF_HUB_OFFLINE, applied by resolve_model
            force=force,
            quiet=quiet,
            verbose=verbose,
            no_log=no_log,
            interactive=interactive,
            endpoint=endpoint,  # a server: nothing is loaded here
            api_key=api_key,
            timeout=timeout,
        )
        session.open(model, system, settings)
        failed = 0
        try:
            if interactive:
                run_repl(session)
            else:
                failed = run_lines(session, _stdin_lines())
        finally:
            session.close()
        if not interactive and failed:
            raise typer.Exit(failed)


def register(app: typer.Typer) -> None:
    app.command(name="chat")(chat)


def _stdin_lines() -> TextIO:
    if sys.stdin is None:
        return io.StringIO("")
    try:
        return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
    except AttributeError:
        return sys.stdin
