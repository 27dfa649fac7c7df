"""`localinfer serve`: an OpenAI-compatible HTTP server (chat and completions, streaming or not) on
the continuous-batching engine; the flags become a ServeConfig and LoadOptions, the rest is
``localinfer.serve``."""


from typing import Annotated, Optional

import typer

from localinfer.cli import options as o
from localinfer.cli.common import handle_errors

_SERVER = "Server"
_SECURITY = "Who may connect"
_MODELS = "Several models"

ParallelOpt = Annotated[int, typer.Option("--parallel", "-np", min=1, max=256, help="Requests decoded together (sequences in the context).", rich_help_panel=_SERVER)]
CtxPerSeqOpt = Annotated[
    Optional[int],
    typer.Option("--ctx-size", "-c", min=16, help="Context of each sequence (prompt + answer), in tokens. Default: the model's trained context, at most 65536 (what coding agents need), reduced to fit memory.", rich_help_panel=o._CONTEXT),
]


@o.grouped
def serve(
    model: Annotated[Optional[list[str]], typer.Option("--model", "-m", help="The model to serve (registry name or .gguf path). Without -m: every installed model, each loaded on its first request; -m repeated: those loaded at start, the others on demand.", rich_help_panel=o._CONTEXT, autocompletion=o.complete_model)] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on. Anything but loopback exposes the model: use --api-key.", rich_help_panel=_SERVER)] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: any free port, printed).", rich_help_panel=_SERVER)] = 8080,
    parallel: ParallelOpt = 4,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="LOCALINFER_API_KEY", help="Require 'Authorization: Bearer KEY' (also LOCALINFER_API_KEY).", rich_help_panel=_SERVER)] = None,
    alias: Annotated[Optional[str], typer.Option("--alias", help="The model's name in the API (default: its registry name).", rich_help_panel=_SERVER)] = None,
    max_queue: Annotated[int, typer.Option("--max-queue", min=0, help="Requests that may wait for a free sequence; more get 503 + Retry-After.", rich_help_panel=_SERVER)] = 64,
    max_body: Annotated[int, typer.Option("--max-body", min=1024, help="Largest request body in bytes (413 beyond).", rich_help_panel=_SERVER)] = 4 * 1024 * 1024,
    drain_timeout: Annotated[float, typer.Option("--drain-timeout", min=0.0, help="On SIGTERM/Ctrl-C, seconds running requests may take to finish before they are cancelled.", rich_help_panel=_SERVER)] = 30.0,
    allowed_host: Annotated[Optional[list[str]], typer.Option("--allowed-host", help="Also answer requests whose Host is NAME (repeatable; '*': any). localhost, IP addresses and --host are always answered.", rich_help_panel=_SECURITY)] = None,
    cors_origin: Annotated[Optional[list[str]], typer.Option("--cors-origin", help="Let web pages at ORIGIN (e.g. http://localhost:3000) call the API (repeatable; '*': any page). Default: none.", rich_help_panel=_SECURITY)] = None,
    max_connections: Annotated[int, typer.Option("--max-connections", min=1, help="Connections open at once; past it the longest idle one is closed (or 503).", rich_help_panel=_SECURITY)] = 1024,
    header_timeout: Annotated[float, typer.Option("--header-timeout", min=0.1, help="Seconds a client has to send a request's headers (408 after).", rich_help_panel=_SECURITY)] = 10.0,
    ctx_size: CtxPerSeqOpt = None,
    n_predict: Annotated[int, typer.Option("--n-predict", "-n", min=-1, help="Tokens an answer may have when the request names no limit (llama-server's -n; -1 or 0: what the context leaves).", rich_help_panel=_SERVER)] = -1,
    template_vars: o.TemplateVars = o.TEMPLATE,
    max_models: Annotated[Optional[int], typer.Option("--max-models", min=1, help="Serving several models: how many stay loaded at once (the least recently used idle one is unloaded). Default: what fits, at most 3 on CPU.", rich_help_panel=_MODELS)] = None,
    keep_alive: Annotated[str, typer.Option("--keep-alive", metavar="DURATION", help="Serving several models: unload a model idle this long (5m, 30s; -1: never). A request's keep_alive wins for its model.", rich_help_panel=_MODELS)] = "5m",
    map_model: Annotated[Optional[list[str]], typer.Option("--map-model", metavar="PATTERN=MODEL", help="Serving several models: a request for a model that is not installed whose name matches PATTERN (fnmatch: 'claude-*', '*') is answered by MODEL (repeatable; the first match wins).", rich_help_panel=_MODELS)] = None,
    no_autoload: Annotated[bool, typer.Option("--no-autoload", help="Serve only the -m models (no others on demand).", rich_help_panel=_MODELS)] = False,
    cache_ram: Annotated[Optional[int], typer.Option("--cache-ram", metavar="MIB", min=0, help="Host memory per model for the prompts idle sequences would lose (an agent's session after another request), in MiB; 0: none. Default: 8192, at most a quarter of the free memory.", rich_help_panel=_SERVER)] = None,
    embedding_ctx: Annotated[int, typer.Option("--embedding-ctx", min=16, help="/v1/embeddings: tokens per llama_decode, and so the longest input (its context is made on the first request).", rich_help_panel=_SERVER)] = 512,
    base: o.Load = o.LOAD.without("ctx_size"),
    draft: o.Drafting = o.DRAFT,
    flags: o.Common = o.COMMON.without("quiet"),
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/embeddings)."""
    with handle_errors():
        if draft is not None:  # one sequence at a time only, for now (generate.drafting)
            draft.single_sequence("serve")
        from localinfer.render.stats import warn
        from localinfer.serve.models import model_map
        from localinfer.serve.config import ServeConfig
        from localinfer.render.progress import make_progress
        from localinfer.store import resolve_model

        server = _import_server()
        from localinfer.serve.http.guard import check_allowed_host, check_origin

        config = ServeConfig(
            host=host, port=port, parallel=parallel, api_key=api_key or None, max_body=max_body, max_queue=max_queue,
            drain_s=drain_timeout, no_log=flags.no_log, verbose=flags.verbose,
            allowed_hosts=tuple(check_allowed_host(h) for h in allowed_host or ()),
            cors_origins=tuple(check_origin(c) for c in cors_origin or ()), max_connections=max_connections,
            header_timeout_s=header_timeout, chat_template_kwargs=template_vars, embedding_ctx=embedding_ctx,
            model_map=model_map.parse(map_model),
            cache_ram=_cache_ram(cache_ram), n_predict=n_predict,
        )  # fmt: skip
        if config.public and config.api_key is None:
            warn(f"listening on {host} without --api-key: anyone who can reach this port can use the model")
        models = list(dict.fromkeys(model or ()))
        from localinfer.serve.models.loader import default_max_models
        from localinfer.serve.models.multi import Served

        if len(models) == 1:  # one model, pinned: loaded at start, answering every name but another model's
            if config.model_map:  # one model answers every name already (multi.Pin)
                warn("--map-model has no effect serving one model: it answers every model name")
            served = _pinned(config, models[0], alias, ctx_size, draft.apply(base) if draft is not None else base,
                             offline=flags.offline, force=flags.force, say=server.log)  # fmt: skip
        else:  # every installed model (or the -m ones and the rest), on demand
            from localinfer.errors import UsageError
            from localinfer.serve.models.multi import is_path

            for name in [*models, *(m for _, m in config.model_map)]:
                if is_path(name):
                    raise UsageError(f"-m {name}: serving several models, each is an installed model's name, not a file",
                                     hint=f"localinfer pull {name} --name NAME, then -m NAME")  # fmt: skip  # installed (pulled now if need be) and named as the API will name it
                resolve_model(name, offline=flags.offline, pull_progress=make_progress())
            served = Served(config, base, ctx_size=ctx_size, only=tuple(models) if no_autoload and models else None,
                            max_models=max_models or default_max_models(base), keep_alive=_seconds(keep_alive), force=flags.force)  # fmt: skip
        _say_cache(config.cache_ram, server.log)
        server.serve(config, served, models if len(models) > 1 else ())


def _pinned(config, spec: str, alias, ctx_size, base, *, offline: bool, force: bool, say):
    """`serve -m MODEL`: the model resolved (pulled if need be), its context sized (said), pinned."""
    from pathlib import Path

    from localinfer.render.progress import make_progress
    from localinfer.render.stats import warn
    from localinfer.serve.models.multi import Pin, Served, load_key
    from localinfer.store import resolve_model

    resolved = resolve_model(spec, offline=offline, pull_progress=make_progress())
    ctx_per_seq = ctx_size or _default_context(resolved, base, config.parallel, config.cache_ram, say)
    n_train = resolved.info.context_length or 0
    if ctx_size and ctx_size > n_train > 0:
        warn(f"--ctx-size {ctx_size} is above the {n_train} tokens this model was trained on; quality may drop")
    names = tuple(dict.fromkeys(n for n in (alias, resolved.name, Path(resolved.path).name) if n))
    return Served(config, base, ctx_size=ctx_per_seq, force=force, pin=Pin(names, load_key(resolved), resolved))


def _say_cache(cache_ram: int, say) -> None:
    """Said once the model is known to load (a refusal of it is the first line)."""
    if cache_ram:
        say(f"prompt cache: up to {cache_ram >> 20} MiB of host memory per model (--cache-ram)")


def _cache_ram(mib: Optional[int]) -> int:
    from localinfer.system.preflight import default_cache_ram

    return default_cache_ram() if mib is None else mib << 20


def _default_context(resolved, options, parallel: int, cache_ram: int, say) -> int:
    """Each sequence's context without -c: sized for agents and the memory (less the prompt cache),
    said at start."""
    from localinfer.system.preflight import serve_context

    ctx = serve_context(resolved.info, options, parallel, reserved=cache_ram)
    say(f"context: {ctx.per_seq} tokens per sequence x {parallel} ({ctx.why}; -c sets it)")
    return ctx.per_seq


def _seconds(keep_alive: str) -> float:
    from localinfer.units import parse_keep_alive

    seconds = parse_keep_alive(keep_alive)
    return 0.0 if seconds is None else seconds


def _import_server():
    """The server module; its dependencies (Starlette, uvicorn) are the optional ``serve`` extra."""
    try:
        from localinfer.serve.http import server
    except ImportError as exc:
        from localinfer.errors import LocalInferError
        from localinfer.cli.extras import pip_install

        raise LocalInferError(
            f"`localinfer serve` needs {exc.name or 'its server packages'}, which is not installed",
            hint=pip_install("serve"),
        ) from None
    return server


def register(app: typer.Typer) -> None:
    app.command(name="serve")(serve)
