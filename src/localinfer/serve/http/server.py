"""Running the server: bind, then serve the models (``multi.Served``: one pinned with -m, which loads
while ``/health`` says 503; or every installed one on demand); on SIGTERM or Ctrl-C stop accepting,
let running requests finish for ``drain_s`` seconds, cancel the rest (a second signal cancels at
once) and return - the command exits 0. A pinned model (or a -m one) that fails to load stops the
server with its error.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import uvicorn

from localinfer.errors import UsageError
from localinfer.serve.http.app import ServerState, create_app
from localinfer.serve.scheduler.bridge import Hub
from localinfer.serve.config import ServeConfig
from localinfer.serve.http.connections import FD_RESERVE, Limits, protocol_class, raise_file_limit

if TYPE_CHECKING:
    from localinfer.serve.http.metrics import Metrics
    from localinfer.serve.models.multi import Served

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


class _Server(uvicorn.Server):
    """uvicorn's server with our own signal handling (uvicorn re-raises the signal once it has shut
    down, so the process would die of it; a server that drained exits 0), and the models' loads and
    keep-alive (``Served.run``) beside it."""

    def __init__(self, config: uvicorn.Config, state: ServerState, preload: list[str], say: Say) -> None:
        super().__init__(config)
        self.state, self.preload, self.say = state, preload, say
        self.error: BaseException | None = None

    def failed(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self.should_exit = True  # uvicorn's main loop looks at it ten times a second

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        hub = self.state.hub = Hub(asyncio.get_running_loop())
        await super().startup(sockets)
        served = self.state.models
        hub.deferred = True  # each engine flushes before its decodes
        served.hub = hub
        self._models_task = asyncio.ensure_future(served.run(self.preload, self.failed))

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
        engines = self.state.models.engines()
        if self.should_exit:  # the second signal: cancel what still runs
            self.force_exit = True
            for engine in engines:
                engine.cancel_all()
            return
        self.should_exit = True
        self.state.models.stopping = True
        busy = sum(engine.running + engine.queued for engine in engines)
        if busy and self.error is None:
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


def serve(config: ServeConfig, served: Served, preload: Sequence[str] = (), *, say: Say | None = None) -> None:
    """Serve ``served``'s models until SIGTERM / Ctrl-C: its pinned model, loaded now (``/health``
    says 503 meanwhile), or every installed model, each loaded on demand and the ``preload`` ones at
    start. A model that fails to load at start raises its error once the server has stopped."""
    say = say or log
    sock = listen(config.host, config.port)
    host, port = sock.getsockname()[:2]
    state = ServerState(config, served, created=int(time.time()), say=say)
    served.metrics, served.say, served.router.say = state.metrics, say, say
    server = _Server(http_config(create_app(state), config, say, state.metrics), state, list(preload), say)
    shown = f"[{host}]" if ":" in host else host
    for line in _starting(f"http://{shown}:{port}", served, preload):
        say(line)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        served.stopping = True
        served.router.stop_all()
    if server.error is not None:
        raise server.error


def _starting(url: str, served: Served, preload: Sequence[str]) -> list[str]:
    """What serve says as it starts listening: what it serves, and how."""
    if served.pin is not None:
        return [f"listening on {url} (loading {served.pin.names[0]}; /health answers 503 until it is ready)"]
    names = served.servable()
    lines = [f"listening on {url}: {len(names)} model(s) can be served, each loaded on its first request"]
    lines += [f"  {name}{' (loading now)' if name in preload else ''}" for name in names]
    from localinfer.serve.models.fit import start_warning

    warning = start_warning(served.ctx_size, names, force=served.force)
    if warning is not None:
        lines.append(f"warning: {warning}")
    if served.config.model_map:
        from localinfer.serve.models.model_map import lines as mapped

        lines += mapped(served.config.model_map)
    return lines


def log(message: str) -> None:
    """One line of serve's log, on stderr."""
    sys.stderr.write(f"localinfer serve: {message}\n")
    sys.stderr.flush()
