"""Running the server: bind, serve (``/health`` says 503) while the model loads on a thread, then
answer; on SIGTERM or Ctrl-C stop accepting, let running requests finish for ``drain_s`` seconds,
cancel the rest (a second signal cancels at once) and return - the command exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from localinfer.errors import UsageError
from localinfer.serve.app import ServerState, create_app
from localinfer.serve.bridge import Hub
from localinfer.serve.config import ServeConfig
from localinfer.serve.connections import FD_RESERVE, Limits, protocol_class, raise_file_limit

if TYPE_CHECKING:
    from localinfer.engine.types import LoadOptions
    from localinfer.serve.engine import Ended, Ticket
    from localinfer.serve.metrics import Metrics
    from localinfer.serve.record import UsageWriter
    from localinfer.store import ResolvedModel

Say = Callable[[str], None]


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything loads: a port in use is a usage error, not a log line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", hint="choose another --port (0: any free port)") from None
    sock.listen(2048)
    return sock


class _Loader:
    """Loads the model and starts the engine on a thread of its own, so the server answers meanwhile."""

    def __init__(self, state: ServerState, resolved: ResolvedModel, options: LoadOptions, *, force: bool,
                 writer: UsageWriter | None, say: Say) -> None:  # fmt: skip
        self.state, self.resolved, self.options, self.force, self.writer, self.say = state, resolved, options, force, writer, say
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="localinfer-load", daemon=True)
        self.stopping = False
        self.on_failure: Callable[[], None] = lambda: None

    def _run(self) -> None:
        from localinfer.generate import loading
        from localinfer.batch import job as batchjob
        from localinfer.serve.engine import Engine

        state, config = self.state, self.state.config
        try:
            t0 = time.perf_counter()
            loaded = loading.load(self.resolved, self.options, force=self.force)
            batchjob.check_template(loaded)  # a template the sandbox refuses fails now, not per request
            if self.stopping:
                loaded.close()
                return
            hub = state.hub
            assert hub is not None  # made by the server's startup, before this thread starts
            hub.deferred = True  # the engine flushes before each decode
            engine = Engine(loaded, config.parallel, max_queue=config.max_queue, on_finish=self._finished, on_step=hub.flush,
                            cache_bytes=config.cache_ram,
                            template_kwargs=config.chat_template_kwargs, embed_ctx=config.embedding_ctx,
                            on_embedded=self.writer.add_embedding if self.writer else None)  # fmt: skip
            engine.start()
            state.engine = engine
            self.say(f"ready: {state.names[0]} loaded in {time.perf_counter() - t0:.1f} s, {config.parallel} sequences "
                     f"x {engine.n_ctx_seq} tokens")  # fmt: skip
        except BaseException as exc:  # reported by serve() once the server has stopped
            self.error = exc
            self.on_failure()

    def _finished(self, ticket: Ticket, outcome: Ended) -> None:
        self.state.metrics.finished(outcome)
        if self.writer is not None:
            self.writer.add(ticket, outcome)


class _Server(uvicorn.Server):
    """uvicorn's server with our own signal handling (uvicorn re-raises the signal once it has shut
    down, so the process would die of it; a server that drained exits 0)."""

    def __init__(self, config: uvicorn.Config, state: ServerState, loader: _Loader | _Preload, say: Say) -> None:
        super().__init__(config)
        self.state, self.loader, self.say = state, loader, say
        loader.on_failure = self._stop

    def _stop(self) -> None:
        self.should_exit = True  # uvicorn's main loop looks at it ten times a second

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self.state.hub = Hub(asyncio.get_running_loop())
        await super().startup(sockets)
        self.loader.thread.start()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, sig: int, frame: Any) -> None:
        engine = self.state.engine
        if self.should_exit:  # the second signal: cancel what still runs
            self.force_exit = True
            if engine is not None:
                engine.cancel_all()
            return
        self.should_exit = True
        self.loader.stopping = True
        busy = (engine.running + engine.queued) if engine is not None else 0
        if busy and self.loader.error is None:
            self.say(f"stopping: {busy} request(s) may finish within {self.config.timeout_graceful_shutdown:g} s "
                     f"(send the signal again to cancel them)")  # fmt: skip


def http_config(app: Any, config: ServeConfig, say: Say, metrics: Metrics | None = None) -> uvicorn.Config:
    """uvicorn's settings, its connections bounded (``connections``) within the descriptor limit;
    what the connections answer themselves (431, 408, 503) is counted in ``metrics``."""
    soft = raise_file_limit(config.max_connections + 2 * FD_RESERVE)
    most = max(1, min(config.max_connections, soft - FD_RESERVE))
    if most < config.max_connections:
        say(f"at most {most} connections at once: the open-file limit is {soft} (ulimit -n)")
    refused = None if metrics is None else (lambda status: metrics.answered("connection", status))
    limits = Limits(header_timeout_s=config.header_timeout_s, max_connections=most, refused=refused)
    return uvicorn.Config(
        app, http=protocol_class(limits), lifespan="off", ws="none", log_level="info" if config.verbose else "warning",
        access_log=config.verbose, timeout_graceful_shutdown=config.drain_s, timeout_keep_alive=30, server_header=False,
    )  # fmt: skip


def serve(config: ServeConfig, resolved: ResolvedModel, options: LoadOptions, *, force: bool = False,
          alias: str | None = None, say: Say | None = None) -> None:  # fmt: skip
    """Serve ``resolved`` until SIGTERM / Ctrl-C; a model that fails to load raises its error."""
    from localinfer.serve.record import UsageWriter
    from localinfer.usage.history import logging_enabled

    say = say or log
    sock = listen(config.host, config.port)
    host, port = sock.getsockname()[:2]
    names = tuple(dict.fromkeys(n for n in (alias, resolved.name, Path(resolved.path).name) if n))
    state = ServerState(config, names, created=int(time.time()), say=say)
    writer = UsageWriter(resolved, names[0], config.parallel, warn=say) if logging_enabled(config.no_log) else None
    loader = _Loader(state, resolved, options, force=force, writer=writer, say=say)
    server = _Server(http_config(create_app(state), config, say, state.metrics), state, loader, say)
    shown = f"[{host}]" if ":" in host else host
    say(f"listening on http://{shown}:{port} (loading {names[0]}; /health answers 503 until it is ready)")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        if loader.thread.is_alive():
            loader.thread.join()
        if state.engine is not None:
            state.engine.stop()
        if writer is not None:
            writer.close()
    if loader.error is not None:
        raise loader.error


def log(message: str) -> None:
    """One line of serve's log, on stderr."""
    sys.stderr.write(f"localinfer serve: {message}\n")
    sys.stderr.flush()


class _Preload:
    """``serve_all``'s stand-in for ``_Loader``: the -m models load on the loop, through the router."""

    def __init__(self, names: list[str]) -> None:
        self.names, self.stopping = names, False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=lambda: None, name="localinfer-preload", daemon=True)
        self.on_failure: Callable[[], None] = lambda: None

    def failed(self, exc: BaseException) -> None:
        self.error = exc
        self.on_failure()


class _ManyServer(_Server):
    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        served, hub = self.state.router, self.state.hub
        assert hub is not None
        hub.deferred = True  # each engine flushes before its decodes
        served.hub = hub
        loader = self.loader
        assert isinstance(loader, _Preload) and served is not None
        self._router_task = asyncio.ensure_future(served.run(loader.names, loader.failed))


def serve_all(config: ServeConfig, served: Any, preload: list[str], *, say: Say | None = None) -> None:
    """Serve every installed model (``multi.Served``) until SIGTERM / Ctrl-C, loading each on
    demand; the ``preload`` models load at start (one that fails stops the server with its error)."""
    say = say or log
    sock = listen(config.host, config.port)
    host, port = sock.getsockname()[:2]
    state = ServerState(config, (), created=int(time.time()), router=served, say=say)
    served.metrics, served.say, served.router.say = state.metrics, say, say
    loader = _Preload(preload)
    server = _ManyServer(http_config(create_app(state), config, say, state.metrics), state, loader, say)
    shown = f"[{host}]" if ":" in host else host
    names = served.servable()
    say(f"listening on http://{shown}:{port}: {len(names)} model(s) can be served, each loaded on its first request")
    for name in names:
        say(f"  {name}{' (loading now)' if name in preload else ''}")
    from localinfer.serve.fit import start_warning

    warning = start_warning(served.ctx_size, names, force=served.force)
    if warning is not None:
        say(f"warning: {warning}")
    if config.model_map:
        from localinfer.serve.model_map import lines

        for line in lines(config.model_map):
            say(line)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        served.router.stop_all()
    if loader.error is not None:
        raise loader.error
