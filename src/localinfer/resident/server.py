"""The resident server: one process per user on a private Unix socket (``python -m
localinfer.resident.server``, started by ``client.find_or_start``). Each loaded model is our serve
app (``serve.http.app``) on its own engine, reached at ``/m/ID/v1/...``; ``/resident/load`` loads or
reloads one as a request needs, ``/resident/ps`` and ``/resident/stop`` are ``ps`` and ``stop``.
Which models stay loaded is the router core `serve` shares (``serve.models.router``): least recently used
idle ones go first, a model idle for its keep-alive is unloaded; with nothing loaded the server exits.
A connection from another uid or mount namespace is answered 403 before its request is read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localinfer.resident.loading import Preload, Resolver, load_model, want_of
from localinfer.serve.models.pool import Want
from localinfer.resident.start import peer_problem, runtime_env
from localinfer.serve.models.router import Router

TICK_S = 0.1  # how often idle models are looked at: unloads are on time to this
EMPTY_GRACE_S = 1.0  # with nothing loaded (the last model unloaded, a load refused), exit after this
FRESH_GRACE_S = 10.0  # a fresh server waits this long for its first request (its runner's command imports first)


def model_id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:12]


@dataclass
class ResidentModel:
    """What the router holds for one loaded model: its serve app and engine."""

    id: str
    app: Any
    engine: Any
    size_bytes: int
    path: str
    fresh_load_s: float | None = None  # set when loaded, told to the request that loaded it


class Resident:
    """The loaded models (``router``) and the routes in front of them (an ASGI app)."""

    def __init__(self, *, max_models: int | None, say: Callable[[str], None]) -> None:
        self.router = Router(stop=lambda m: m.engine.stop(), active=lambda m: m.engine.running + m.engine.queued > 0,
                             max_models=max_models, max_queue=1024, say=say)  # fmt: skip
        self.say = say
        self.busy = 0  # requests in flight, all routes
        self.empty_since = time.monotonic()
        self.exiting = False
        self.on_exit: Callable[[], None] = lambda: None
        self.resolve = Resolver()
        self.preload: Preload | None = None
        self.asked = False  # any request served yet (a fresh server waits longer: FRESH_GRACE_S)

    # -- HTTP ------------------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        self.busy += 1
        fresh, self.asked = not self.asked, True
        try:
            if path.startswith("/m/"):
                await self._model_route(scope, receive, send)
            elif path == "/resident/load" and scope["method"] == "POST":
                status, answer = await self._load(await _json_body(receive))
                if fresh and status == 422 and answer["error"]["type"] == "ModelNotFoundError":
                    self.asked = False  # its command checks (or pulls) the model and asks again: still fresh
                await self._reply(send, status, answer)
            elif path == "/resident/ps":
                await self._reply(send, 200, self.ps())
            elif path == "/resident/stop" and scope["method"] == "POST":
                await self._reply(send, 200, await self._stop(await _json_body(receive)))
            else:
                await self._reply(send, 404, _error(f"no route {path}", "not_found"))
        finally:
            self.busy -= 1
            if not self.router.slots:
                self.empty_since = time.monotonic()

    def slot(self, ident: str) -> Any:
        return next((s for s in self.router.slots.values() if s.held.id == ident), None)

    async def _model_route(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        _, _, ident, rest = scope["path"].split("/", 3)
        slot = self.slot(ident)
        if slot is None:
            await self._reply(send, 404, _error("that model is no longer loaded: run the command again", "model_unloaded"))
            return
        self.router.hold(slot)
        try:
            inner = {**scope, "path": "/" + rest, "raw_path": ("/" + rest).encode()}
            await slot.held.app(inner, receive, send)
        finally:
            self.router.release(slot)

    @staticmethod
    async def _reply(send: Callable, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    # -- loading -------------------------------------------------------------------------------------
    async def _load(self, body: dict[str, Any]) -> tuple[int, Any]:
        if self.exiting:
            return 503, _error("the resident server is stopping", "stopping")
        try:
            if body.get("max_models"):  # the latest command's limit holds from its own load on
                self.router.max_models = int(body["max_models"])
            pre, self.preload = self.preload, None
            if pre is not None and pre.body != body:
                asyncio.ensure_future(asyncio.to_thread(pre.discard))
                pre = None
            if pre is not None:  # the model this server was started for, loading since it started
                await asyncio.to_thread(pre.done.wait)
            keep = float(body.get("keep_alive", 300))
            loop = asyncio.get_running_loop()
            if pre is not None and pre.error is None:
                resolved, want, loaded = pre.result
                slot, notes = self.router.adopt(want, resolved.name, self._start(want, resolved.name, loaded, loop)), []
                self.router.hold(slot)
                slot.info.keep_alive = math.inf if keep < 0 else keep
            else:
                resolved = await asyncio.to_thread(self.resolve, body.get("spec"))
                first, default_ctx, force = want_of(body, resolved), body.get("ctx_per_seq") is None, bool(body.get("force"))

                def make(want: Want) -> ResidentModel:  # a reload (a grown want) sizes its context as asked
                    loaded = load_model(resolved, want, default_ctx=default_ctx and want == first, force=force)
                    return self._start(want, resolved.name, loaded, loop)

                slot, notes = await self.router.acquire(first, resolved.name, make, keep_alive=keep)
            self.router.release(slot)
            model = slot.held
            load_s, model.fresh_load_s = model.fresh_load_s or 0.0, None
        except Exception as exc:  # every failure goes back to the command as its own error
            from localinfer.errors import LocalInferError

            if not isinstance(exc, LocalInferError):
                self.say(f"load failed: {type(exc).__name__}: {exc}")
            return 422, {"error": {"message": str(exc), "hint": getattr(exc, "hint", None), "type": type(exc).__name__}}
        from localinfer.answer.answer import load_facts

        loaded = model.engine.loaded
        # the load's own notes (a context llama.cpp rounded up...) on every command it serves, as a
        # local run says them each time; then what this command's load did (a reload, an unload)
        notes = [*(loaded.plan.notes if loaded.plan is not None else ()), *notes]
        return 200, {"id": model.id, "name": slot.info.name, "sha256": resolved.sha256, "n_ctx": slot.info.n_ctx_seq,
                     "notes": notes, "load_s": load_s, "can_chat": loaded.template is not None, "rss": _rss(), "pid": os.getpid(),
                     "env": runtime_env(),
                     "facts": load_facts(loaded.plan, loaded.buffers)}  # fmt: skip

    def _start(self, want: Want, name: str, loaded: Any, loop: asyncio.AbstractEventLoop) -> ResidentModel:
        """Our serve app on its own engine, for a model just loaded (any thread)."""
        from localinfer.serve.http.app import ServerState, create_app
        from localinfer.serve.scheduler.bridge import Hub
        from localinfer.serve.config import ServeConfig
        from localinfer.serve.scheduler.worker import Engine
        from localinfer.serve.wires import catalog as wires

        config = ServeConfig(parallel=want.sequences, no_log=True)
        hub = Hub(loop, deferred=True)
        engine = Engine(loaded, want.sequences, max_queue=64, on_step=hub.flush)
        engine.start()
        state = ServerState.holding(config, (name, want.key), engine, key=want.key, n_ctx_seq=engine.n_ctx_seq, created=int(time.time()))
        state.hub = hub
        buffers = loaded.buffers
        size = buffers.total() if buffers is not None and buffers.buffers else os.path.getsize(want.key)
        self.say(f"loaded {name} in {loaded.load_s:.1f} s: {want.sequences} sequence(s) x {engine.n_ctx_seq} tokens")
        # OpenAI's routes answer whole here (catalog.WHOLE): our CLI reads each answer's record and an error's cause
        return ResidentModel(model_id(want.key), create_app(state, completions=wires.WHOLE), engine, size, want.key, fresh_load_s=loaded.load_s)

    # -- ps and stop -------------------------------------------------------------------------------------
    def ps(self) -> dict[str, Any]:
        now = time.monotonic()
        models = [{
            "name": s.info.name, "path": s.key, "size_bytes": s.held.size_bytes, "sequences": s.info.sequences,
            "context": s.info.n_ctx_seq, "busy": s.info.busy, "idle_s": round(s.info.idle_for(now), 3),
            "keep_alive_s": None if s.info.keep_alive == math.inf else s.info.keep_alive,
            "unloads_in_s": None if s.info.keep_alive == math.inf else round(s.info.unloads_in(now), 3),
        } for s in self.router.slots.values()]  # fmt: skip
        return {"pid": os.getpid(), "rss": _rss(), "models": models}

    async def _stop(self, body: dict[str, Any]) -> dict[str, Any]:
        name = body.get("name")
        by_id = self.slot(name) if name else None
        stopped = await self.router.unload(by_id.key if by_id is not None else name)
        return {"stopped": stopped, "left": len(self.router.slots), "pid": os.getpid()}

    # -- the clock -----------------------------------------------------------------------------------------
    async def reap(self) -> None:
        """Unload models idle past their keep-alive; exit once nothing is loaded or asked for."""
        while not self.exiting:
            await asyncio.sleep(TICK_S)
            await self.router.reap()
            if self.router.slots or self.router.loading:
                self.empty_since = time.monotonic()
            idle = not self.router.slots and not self.busy and self.preload is None
            if idle and time.monotonic() - self.empty_since >= (EMPTY_GRACE_S if self.asked else FRESH_GRACE_S):
                self.exiting = True
                self.on_exit()


async def _json_body(receive: Callable) -> dict[str, Any]:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    data = b"".join(chunks)
    return json.loads(data) if data else {}


def _error(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code, "param": None}}


def _rss() -> int:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


# -- the process -------------------------------------------------------------------------------------------
def _server(config: Any, resident: Resident, ready_fd: int | None) -> Any:
    """uvicorn with the reaper started beside it, and signals that stop it cleanly (exit 0);
    ``ready_fd``: a pipe told one byte once it serves (the starter waits on it)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            resident.empty_since = time.monotonic()  # the grace runs from now, not from before the imports
            self._reaper = asyncio.ensure_future(resident.reap())
            if ready_fd is not None:
                with contextlib.suppress(OSError):  # a starter that did not wait has closed its end
                    os.write(ready_fd, b"R")
                os.close(ready_fd)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            import signal

            previous = {sig: signal.signal(sig, lambda *_: setattr(self, "should_exit", True)) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localinfer.resident.server")
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--lock", required=True, type=Path)
    parser.add_argument("--socket-fd", type=int, default=None, help="the listening socket, bound by the starter")
    parser.add_argument("--ready-fd", type=int, default=None, help="a pipe to write one byte to once serving")
    parser.add_argument("--life-fd", type=int, default=None, help="a pipe held open while this server lives (the runner watches it)")
    parser.add_argument("--max-models", type=int, default=None)
    parser.add_argument("--preload", action="store_true", help="read the first load request on stdin and start loading it")
    args = parser.parse_args(argv)

    def say(message: str) -> None:
        sys.stderr.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} localinfer resident[{os.getpid()}]: {message}\n")
        sys.stderr.flush()

    from localinfer.resident.start import bind, unlink_if

    sock = bind(args.socket) if args.socket_fd is None else socket.socket(fileno=args.socket_fd)
    sock.listen(256)  # again: SO_PEERCRED now names this process (clients check its mount namespace)
    mine = os.stat(args.socket).st_ino
    resident = Resident(max_models=args.max_models, say=say)
    if args.preload:
        with contextlib.suppress(ValueError):
            resident.preload = Preload(json.loads(sys.stdin.read()), resident.resolve)
    else:
        threading.Thread(target=_warm, name="localinfer-warm", daemon=True).start()
    import uvicorn  # after the socket is bound and the model loading: commands wait on both

    from localinfer.serve.http.connections import Limits, protocol_class

    config = uvicorn.Config(resident, http=protocol_class(Limits(admit=lambda t: _refusal(t, say))), lifespan="off", ws="none",
                            log_level="warning", access_log=False, timeout_graceful_shutdown=5, timeout_keep_alive=30)  # fmt: skip
    server = _server(config, resident, args.ready_fd)

    def leave() -> None:
        unlink_if(args.socket, mine, args.lock)  # new commands start a new server from now on
        server.should_exit = True

    resident.on_exit = leave
    say(f"listening on {args.socket}")
    try:
        server.run(sockets=[sock])
    finally:
        resident.exiting = True
        unlink_if(args.socket, mine, args.lock)
        resident.router.stop_all()
        say("stopped")
    return 0


def _refusal(transport: Any, say: Callable[[str], None]) -> str | None:
    """Why a connection is refused (a 403 before its request is read), None to serve it: a peer of
    another uid, or of another mount namespace (a sandbox of ours sees other files and is not
    trusted: docs/security.md), as ``start.peer_problem`` checks the serving side."""
    why = peer_problem(transport.get_extra_info("socket"), serving=True)
    if why is None:
        return None
    say(f"refused a connection: the process connecting {why}")
    return "the resident server serves only its own user's processes, in its own mount namespace"


def _warm() -> None:
    """What a first load needs, imported while uvicorn is (the first request names its model later)."""
    with contextlib.suppress(Exception):
        import localinfer.batch.job
        import localinfer.engine.model  # llama_cpp
        import localinfer.generate.loading
        import localinfer.generate.run
        import localinfer.serve.http.app
        import localinfer.store  # noqa: F401


if __name__ == "__main__":
    threading.current_thread().name = "localinfer-resident"
    sys.exit(main())
