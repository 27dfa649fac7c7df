"""The models `localinfer serve` answers, on the shared router core (``serve.models.router``): every
installed model (and the package-shipped default) under its name, loaded on demand; or, with one
-m, that one model pinned (``Pin``): loaded at start, never unloaded, and answering any name that
is not another model's (clients hard-code names such as ``gpt-4o``, as llama-server answers them).

Owns: a request's ``model`` -> the engine that answers it (names only when serving installed
models: never a path, never a download; an unknown name is a 404 naming the closest installed one);
making a model's engine; the lease a request holds on its model for its whole HTTP exchange
(``Leases``). What the listings say of the models is ``serve.models.listings``'.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.serve.models import fit
from localinfer.serve.models.cores import Cores
from localinfer.serve.models.installed import Installed
from localinfer.serve.models.loader import LoadedEngine, load_error
from localinfer.serve.http.metrics import Gauges, Metrics
from localinfer.serve.wires.openai import ApiError
from localinfer.serve.models.router import Busy, KeptModel, Router

if TYPE_CHECKING:
    from localinfer.engine.types import LoadOptions
    from localinfer.serve.config import ServeConfig
    from localinfer.serve.scheduler.worker import Engine
    from localinfer.store import ResolvedModel

LEASES = "localinfer.leases"  # scope key: the (router, kept model) pairs a request holds
TICK_S = 0.1


@dataclass(frozen=True)
class Pin:
    """The one model `serve -m` serves: its names (the first is the one answers echo), its load key
    (``load_key``) and what it loads (None: handed over loaded: the resident server's, tests')."""

    names: tuple[str, ...]
    key: str
    resolved: ResolvedModel | None = None

    def named(self, name: str | None) -> bool:
        """Asked for by a name of ours (or none): answered without looking at the store."""
        return name is None or name in self.names or name.removesuffix(":latest") in self.names


@dataclass(frozen=True)
class Picked:
    """The model a request is answered by: its engine, its name in the answer, the load it waited for."""

    engine: Engine
    name: str
    load_s: float = 0.0


def is_path(name: str) -> bool:
    """A name that would be a file if it were opened: refused without looking at the disk."""
    return any(c in name for c in "/\\") or name.lower().endswith(".gguf") or name.startswith(("~", "."))


def loading_error() -> ApiError:
    return ApiError(503, "the model is loading", type="unavailable_error", code="model_loading", headers={"Retry-After": "1"})


class Served:
    """The models this server answers and the router that keeps them (``ServerState.models``)."""

    def __init__(self, config: ServeConfig, base: LoadOptions | None, *, ctx_size: int | None = None,
                 only: tuple[str, ...] | None = None, max_models: int | None = None, keep_alive: float = 300.0,
                 force: bool = False, say: Callable[[str], None] = lambda m: None, metrics: Any = None,
                 pin: Pin | None = None) -> None:  # fmt: skip
        self.config, self.base, self.ctx_size, self.only, self.force, self.say = config, base, ctx_size, only, force, say
        self.pin = pin
        self.metrics = metrics or Metrics()  # the server's, once it starts (its totals and ours are one count)
        self.router = Router(stop=LoadedEngine.stop, active=lambda m: m.engine.running + m.engine.queued > 0, max_models=max_models,
                             keep_alive=-1 if pin else keep_alive, max_queue=config.max_queue, say=say)  # fmt: skip
        self.hub: Any = None
        self.cores = Cores()  # a load's CPU, taken from the loaded models' threads while it runs
        self.installed = Installed()  # the servable names, and what each resolves to
        self.contexts: dict[str, int] = {}  # each model file's default context, sized once (a want that moved would reload it)
        self.stopping = False  # the server is shutting down: a load that ends now is dropped

    @classmethod
    def holding(cls, config: ServeConfig, names: tuple[str, ...], engine: Engine | None, *, key: str | None = None,
                n_ctx_seq: int | None = None) -> Served:  # fmt: skip
        """One model already loaded elsewhere (``engine``; None: still loading), pinned under ``names``."""
        from localinfer.serve.models.pool import Want

        pin = Pin(names, key or names[-1])
        served = cls(config, None, pin=pin)
        if engine is not None:
            want = Want(pin.key, {}, config.parallel, n_ctx_seq or 0)
            served.router.adopt(want, names[0], LoadedEngine(names[0], engine), n_ctx_seq=n_ctx_seq or 1)
        return served

    # -- names ---------------------------------------------------------------------------------------
    def servable(self) -> list[str]:
        """The names a request may use: the pinned model's, or the installed models (and the
        registry default), read again when the manifest changed (a `pull` while serving)."""
        if self.pin is not None:
            return [self.pin.names[0]]
        return list(self.only) if self.only is not None else self.installed.names()

    def resolve(self, name: str) -> tuple[str, ResolvedModel]:
        """The installed model ``name`` names (``name``, ``name:latest``), or a 404 naming the closest."""
        from localinfer.fuzzy import rank
        from localinfer.request.rules import MAX_MODEL_NAME

        if len(name) > MAX_MODEL_NAME:  # the wires refuse it first; here too, before difflib sees it
            raise ApiError(400, f"'model' is {len(name)} characters long: a model's name has at most {MAX_MODEL_NAME}",
                           param="model")  # fmt: skip
        if is_path(name):
            raise ApiError(404, f"model '{name}' not found: this server serves installed models by name, never a file "
                                "(`localinfer pull FILE --name NAME` installs one)", code="model_not_found", param="model")  # fmt: skip
        names = self.servable()
        found = next((n for n in (name, name.removesuffix(":latest")) if n in names), None)
        if found is None and self.config.model_map:  # --map-model: agents ask for models never installed
            from localinfer.serve.models.model_map import target

            found = target(self.config.model_map, name, names)
        if found is None:
            closest = rank(name, names)[:1]
            hint = f" (the closest installed: {closest[0]})" if closest else " (no model is installed: `localinfer pull NAME`)"
            raise ApiError(404, f"model '{name}' not found{hint}", code="model_not_found", param="model")
        return found, self._installed(found)

    def _installed(self, name: str) -> ResolvedModel:
        """What an installed name resolves to (remembered while its manifest entry is unchanged)."""
        from localinfer.errors import LocalInferError
        from localinfer.store import resolve_model

        known = self.installed.resolved.get(name)
        if known is None:
            try:
                known = resolve_model(name, offline=True, auto_pull=False)
            except LocalInferError as exc:
                raise ApiError(404, f"model '{name}' cannot be served: {exc}", code="model_not_found", param="model") from None
            self.installed.resolved[name] = known
        return known

    def _not_ours(self, name: str) -> None:
        """With a pinned model: a 404 for a name that is another model's (a .gguf file's, another
        installed model's); any other name is ours. On a thread (it may read the store)."""
        pin = self.pin
        assert pin is not None
        serves = f"this server serves {pin.names[0]}"
        if name.lower().endswith(".gguf"):
            raise ApiError(404, f"model '{name}' not found: {serves}", code="model_not_found", param="model")
        installed = self.installed.names()
        other = next((n for n in (name, name.removesuffix(":latest")) if n in installed), None)
        if other is None:
            return
        try:
            if load_key(self._installed(other)) == pin.key:  # another name of our file
                return
        except ApiError:
            pass
        raise ApiError(404, f"model '{name}' is installed but not loaded here: {serves} (start `localinfer serve -m {name}` "
                            "to serve it)", code="model_not_found", param="model")  # fmt: skip

    def _default_ctx(self, resolved: ResolvedModel, name: str) -> int:
        """A model's context per sequence without -c or num_ctx: as `serve -m` sizes it, said once."""
        key = str(resolved.path)
        if key not in self.contexts:
            from localinfer.system.preflight import serve_context

            ctx = serve_context(resolved.info, self.base, self.config.parallel, reserved=self.config.cache_ram)
            self.contexts[key] = ctx.per_seq
            self.say(f"context for {name}: {ctx.per_seq} tokens per sequence ({ctx.why}; -c or num_ctx sets it)")
        return self.contexts[key]

    # -- a request's model -------------------------------------------------------------------------------
    async def pick(self, scope: dict[str, Any] | None, name: str | None, *, keep_alive: Any = None,
                   num_ctx: Any = None) -> Picked:  # fmt: skip
        """The engine that answers ``name``, loaded if needed and held until the request's exchange
        ends (``Leases``); ``keep_alive`` and ``num_ctx``: Ollama's per-request fields (a pinned
        model keeps its own: it was loaded as -m asked, and stays)."""
        seconds, asked = keep_alive_seconds(keep_alive), num_ctx_tokens(num_ctx)
        if self.pin is not None:
            if not self.pin.named(name):
                await asyncio.to_thread(self._not_ours, name)  # type: ignore[arg-type]
            kept = self.router.slots.get(self.pin.key)
            if kept is None:
                raise loading_error()
            self.router.hold(kept)
            self._lease(scope, kept)
            return Picked(kept.held.engine, self.pin.names[0])
        if name is None:  # no model named: the one used last, else the default
            recent = max(self.router.slots.values(), key=lambda s: s.info.last_used, default=None)
            name = recent.info.name if recent is not None else self._default()
        # keyed by the file's content: two names of one file, or of two copies of it, share one load
        found, resolved, key = await asyncio.to_thread(self._located, name)
        ctx = asked or self.ctx_size or await asyncio.to_thread(self._default_ctx, resolved, found)
        fit.check_trained(found, resolved, ctx, num_ctx=asked is not None, force=self.force)
        want = self._want(resolved, key, ctx)
        check = None if self.force else (lambda w: fit.check_memory(self.router, self.base, resolved, found, w))
        t0, kept_now = time.perf_counter(), self.router.slots.get(key)
        try:
            kept, _ = await self.router.acquire(want, found, lambda w: self._make(resolved, found, w), keep_alive=seconds,
                                                check=check)  # fmt: skip
        except Busy:
            raise ApiError(503, f"too many requests wait for a model to load ({self.config.max_queue}): retry shortly",
                           type="unavailable_error", code="server_overloaded", headers={"Retry-After": "1"}) from None  # fmt: skip
        except Exception as exc:
            raise load_error(found, exc) from None
        self._lease(scope, kept)
        # Ollama's load_duration: the load this request started or waited for (none: 0)
        return Picked(kept.held.engine, found, 0.0 if kept is kept_now else time.perf_counter() - t0)

    async def engine_for(self, scope: dict[str, Any] | None, name: str | None, **fields: Any) -> tuple[Engine, str]:
        """:meth:`pick`'s engine and name."""
        picked = await self.pick(scope, name, **fields)
        return picked.engine, picked.name

    def _lease(self, scope: dict[str, Any] | None, kept: KeptModel) -> None:
        if scope is not None:
            scope.setdefault(LEASES, []).append((self.router, kept))
        else:
            self.router.release(kept)

    def _want(self, resolved: ResolvedModel, key: str, ctx: int) -> Any:
        from localinfer.serve.models.pool import Want

        mmproj = str(resolved.mmproj) if resolved.mmproj else None  # one file, another projector: reloaded
        options = {"mmproj": mmproj, "chat_format": getattr(resolved, "chat_format", None)}  # one file, two templates: reloaded
        return Want(key=key, options=options, sequences=self.config.parallel, ctx_per_seq=ctx)

    def _located(self, name: str) -> tuple[str, ResolvedModel, str]:
        """:meth:`resolve`, and a load's key (:func:`load_key`): file system calls, off the loop."""
        found, resolved = self.resolve(name)
        return found, resolved, load_key(resolved)

    def _default(self) -> str:
        from localinfer.store.registry import load_registry

        return self.only[0] if self.only else load_registry().default

    def _make(self, resolved: ResolvedModel, name: str, want: Any) -> LoadedEngine:
        from localinfer.serve.models import loader
        return loader.make(self, resolved, name, want)

    async def run(self, preload: list[str], on_error: Callable[[BaseException], None]) -> None:
        """Load the pinned model, or the -m models (kept loaded), then unload idle models as their
        keep-alive runs out. A load that fails stops the server with its error (``on_error``)."""
        from localinfer.errors import LocalInferError

        name = ""
        try:
            if self.pin is not None:
                await self._load_pinned()
            for name in preload:
                await self.engine_for(None, name, keep_alive=-1)
        except asyncio.CancelledError:  # the server stops
            raise
        except ApiError as exc:  # said as the command's error, not as an HTTP answer
            on_error(LocalInferError(f"-m {name}: {exc.message}"))
            return
        except BaseException as exc:
            if not self.stopping:
                on_error(exc)
            return
        await asyncio.to_thread(self._find_all)
        while True:
            await asyncio.sleep(TICK_S)
            await self.router.reap()

    async def _load_pinned(self) -> None:
        """The -m model, loaded as the command sized it (its errors raised as they are: the table's codes)."""
        pin = self.pin
        assert pin is not None and pin.resolved is not None and self.ctx_size is not None
        resolved, name = pin.resolved, pin.names[0]
        kept, _ = await self.router.acquire(self._want(resolved, pin.key, self.ctx_size), name,
                                            lambda w: self._make(resolved, name, w))  # fmt: skip
        self.router.release(kept)

    def _find_all(self) -> None:
        """Find (and verify, the first time) every servable model now, so a first request pays only the load."""
        if self.pin is not None:
            return
        for name in self.servable():
            try:
                self.resolve(name)
            except ApiError:
                pass

    # -- what is loaded ------------------------------------------------------------------------------------
    def ready(self) -> bool:
        """Whether requests can be answered: the pinned model loaded (else: always; models load on demand)."""
        return self.pin is None or self.pin.key in self.router.slots

    def engines(self) -> list[Engine]:
        return [s.held.engine for s in self.router.slots.values()]

    def gauges(self) -> Gauges:
        if not self.ready():
            return Gauges()
        return Gauges.of(self.engines(), self.router.waiting)

    def loaded(self, *, aliases: bool = True) -> dict[str, KeptModel]:
        """Each loaded model under the name it was loaded for, and (``aliases``) under every other
        name of its file (the listings say each is loaded; /api/ps and /metrics count it once)."""
        kept = {s.info.name: s for s in self.router.slots.values()}
        if not aliases:
            return kept
        by_key = {s.key: s for s in self.router.slots.values()}
        for name, resolved in list(self.installed.resolved.items()):
            found = by_key.get(load_key(resolved))
            if found is not None:
                kept.setdefault(name, found)
        return kept


class Leases:
    """Releases the models a request held once its whole exchange (a stream included) has ended."""

    def __init__(self, app: Callable) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        held: list[tuple[Router, Any]] = scope.setdefault(LEASES, [])
        try:
            await self.app(scope, receive, send)
        finally:
            for router, kept in held:
                router.release(kept)
            held.clear()


def load_key(resolved: ResolvedModel) -> str:
    """What one loaded model answers for: the file's verified digest (a model pulled from the shipped
    file is a copy of it), else its real path (links to one file)."""
    digest = getattr(resolved, "sha256", None)
    return f"sha256:{digest}" if digest else os.path.realpath(resolved.path)


def keep_alive_seconds(value: Any) -> float | None:
    """Ollama's ``keep_alive``: seconds, or a duration (``5m``); 0 unloads after the request, -1 never."""
    if value is None:
        return None
    from localinfer.errors import UsageError
    from localinfer.units import parse_keep_alive

    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ApiError(400, f"'keep_alive' must be a duration such as 5m or a number of seconds, not {value!r}", param="keep_alive")
    try:
        seconds = parse_keep_alive(value)
    except UsageError:
        raise ApiError(400, f"'keep_alive' must be a duration such as 5m, 30s or -1, not {value!r}", param="keep_alive") from None
    return 0.0 if seconds is None else seconds


def num_ctx_tokens(value: Any) -> int | None:
    """Ollama's ``options.num_ctx``: a context per sequence that sizes the model's load."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 16:
        raise ApiError(400, f"'options.num_ctx' must be a whole number of tokens, at least 16, not {value!r}", param="num_ctx")
    return value
