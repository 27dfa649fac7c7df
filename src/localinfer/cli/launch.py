"""`localinfer launch AGENT`: a coding agent on a local model in one command (``localinfer.launch``)."""

import sys
from typing import Annotated, Optional

import typer

from localinfer.cli.common import handle_errors

_AGENTS = "claude (Claude Code), codex (Codex CLI), opencode (OpenCode), qwen (Qwen Code), crush (Crush), continue (Continue CLI)"


def launch(
    agent: Annotated[str, typer.Argument(metavar="AGENT", help=f"The agent: {_AGENTS}.", show_default=False)],
    agent_args: Annotated[Optional[list[str]], typer.Argument(metavar="[-- AGENT-ARGS...]", help="Passed to the agent as they are.", show_default=False)] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="The installed model the agent uses (default: the registry's default).")] = None,
    server_url: Annotated[Optional[str], typer.Option("--endpoint", metavar="URL", help="Use the `localinfer serve` at URL (e.g. http://127.0.0.1:8080) instead of the one launch starts.")] = None,
    n_predict: Annotated[Optional[int], typer.Option("--n-predict", "-n", min=1, help="An answer's tokens at most: the --n-predict of the server launch starts (Codex names no limit) and the output limit the other agents ask for. Default: a quarter of the context.")] = None,
    print_only: Annotated[bool, typer.Option("--print", help="Print the variables, the private config and the command instead of running the agent.")] = False,
) -> None:
    """Run a coding agent (Claude Code, Codex, OpenCode, Qwen Code, Crush, Continue) on a local model:
    a `serve` is started in the background if none runs (and left running: `localinfer stop` stops
    it); the user's own agent settings are never written (docs/agents.md)."""
    with handle_errors():
        import os
        import shutil

        from localinfer.errors import ModelNotFoundError, UsageError
        from localinfer.launch import agents, server
        from localinfer.render.stats import warn

        spec = agents.AGENTS.get(agent.lower())
        if spec is None:
            raise UsageError(f"no agent named '{agent}': launch knows {_AGENTS}")
        binary = shutil.which(spec.binary)
        if binary is None and not print_only:  # not found on disk: the table's NOT_FOUND, as a missing file
            raise ModelNotFoundError(f"{spec.binary} is not on PATH: install {spec.title} with `npm install -g {spec.package}`")
        name, ctx = _model(model, server_url is not None, warn)
        token = os.environ.get("LOCALINFER_API_KEY") or "localinfer"  # serve started by us reads it too
        if server_url:
            url = _root(server_url)
            ctx = ctx or server.context(url, name, token)
        else:
            info = server.running()
            if info is not None and info.get("model") != name:
                warn(f"using the server launch started for {info.get('model')} ({info['url']}): {name} is loaded there on demand; "
                     "`localinfer stop` first to start one sized for it")  # fmt: skip
            elif info is not None and n_predict is not None and info.get("n_predict") != n_predict:
                warn(f"using the server launch started ({info['url']}), whose --n-predict is {info.get('n_predict')}: "
                     "`localinfer stop` first to start one with yours")  # fmt: skip
            if info is None:
                size = ctx or agents.AGENT_CTX
                say = lambda m: sys.stderr.write(f"localinfer launch: {m}\n")  # noqa: E731
                info = server.start(name, size, n_predict or agents.output_cap(size), say)
            url = info["url"]
            server.preload(url, name, token)
        setup = agents.setup(spec, url=url, model=name, ctx=ctx, token=token, folder=server.folder(), output=n_predict)
        agents.write(setup)
        if print_only:
            sys.stdout.write(agents.shown(spec, setup, list(agent_args or ()), url, name))
            return
        env = {k: v for k, v in os.environ.items() if k not in setup.unset}
        env.update(setup.env)
        raise typer.Exit(_run([binary, *setup.args, *(agent_args or ())], env))


def _model(model: Optional[str], remote: bool, warn) -> tuple[str, Optional[int]]:
    """The installed model's name (as serve names it) and the context to give it: what serve gives one
    sequence of it by default (its trained context, at most what agents need, within the memory the
    pre-flight finds beside the prompt cache); a warning names both figures when it is less."""
    from localinfer.errors import UsageError
    from localinfer.launch.agents import AGENT_CTX
    from localinfer.serve.models.multi import is_path

    if model is not None and is_path(model):
        raise UsageError(f"-m {model}: launch serves installed models by name, not a file",
                         hint=f"localinfer pull {model} --name NAME, then -m NAME")  # fmt: skip
    if remote and model is not None:
        return model, None  # the endpoint's business: it may serve models not installed here
    from localinfer.render.progress import make_progress
    from localinfer.store import resolve_model

    from localinfer.engine.types import LoadOptions
    from localinfer.system.preflight import default_cache_ram, serve_context

    resolved = resolve_model(model, pull_progress=make_progress())
    ctx = serve_context(resolved.info, LoadOptions(), 1, reserved=default_cache_ram())
    per_seq = min(ctx.per_seq, AGENT_CTX)
    if per_seq < AGENT_CTX:  # a model trained on less, or a machine without the memory for more
        warn(f"{resolved.name} gets {per_seq} tokens of context ({ctx.why}); agents need {AGENT_CTX}: "
             "a longer prompt is refused")  # fmt: skip
    return resolved.name, per_seq


def _root(url: str) -> str:
    from localinfer.errors import UsageError

    url = url.rstrip("/").removesuffix("/v1")
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"--endpoint {url}: expected a URL such as http://127.0.0.1:8080")
    return url


def _run(argv: list[str], env: dict) -> int:
    """The agent in the foreground; its exit status. Ctrl-C is the agent's (it gets the signal too)."""
    import signal
    import subprocess

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return subprocess.call(argv, env=env)
    finally:
        signal.signal(signal.SIGINT, previous)


def register(app: typer.Typer) -> None:
    app.command(name="launch")(launch)
