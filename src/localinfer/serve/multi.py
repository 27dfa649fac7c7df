"""`localinfer serve` without one -m: every installed model (and the package-shipped default) under
its name, loaded on demand by the shared router core (``serve.router``).

Owns: a request's ``model`` -> an installed model (names only: never a path, never a download; an
unknown name is a 404 naming the closest installed one); making a model's engine; the lease a request
holds on its model for its whole HTTP exchange (``Leases``); the listings and figures per model.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from localinfer.serve import fit
from localinfer.serve.cores import Cores
from localinfer.serve.installed import Installed
from localinfer.serve.metrics import Gauges, Metrics
from localinfer.serve.protocol import ApiError
from localinfer.serve.router import Busy, Router

if TYPE_CHECKING:
    from localinfer.engine.types import LoadOptions
    from localinfer.serve.config import ServeConfig
    from localinfer.serve.engine import Engine
    from localinfer.store import ResolvedModel

LEASES = "localinfer.leases"  # scope key: the (router, slot) pairs a request holds
CPU_MAX_MODELS = 3  # as Ollama: on CPU at most this many at once unless --max-models says otherwise
TICK_S = 0.1


@dataclass
class Model:
    """What the router holds for one loaded model: its engine and what records its answers."""

    name: str
    engine: Engine
    writer: Any = None  # record.UsageWriter, or None with --no-log
    leave: Callable[[], None] | None = None  # its CPU share ends (serve.cores)

    @property
    def n_ctx_seq(self) -> int:
        return self.engine.n_ctx_seq

    def stop(self) -> None:
        if self.leave is not None:
            self.leave()
        self.engine.stop()
        if self.writer is not None:
            self.writer.close()


def is_path(name: str) -> bool:
    """A name that would be a file if it were opened: refused without looking at the disk."""
    return any(c in name for c in "/\\") or name.lower().endswith(".gguf") or name.startswith(("~", "."))


def default_max_models(base: LoadOptions) -> int | None:
    """As many as fit (the pre-flight decides), and at most 3 when nothing runs on a GPU."""
    if base.n_gpu_layers == 0:
        return CPU_MAX_MODELS
    from localinfer.system.hardware import gpus

    try:
        return None if gpus() else CPU_MAX_MODELS
    except Exception:
        return CPU_MAX_MODELS


class Served:
    """The models this server can answer and the router that loads them (``ServerState.router``)."""

    def __init__(self, config: ServeConfig, base: LoadOptions, *, ctx_size: int | None = None,
                 only: tuple[str, ...] | None = None, max_models: int | None = None, keep_alive: float = 300.0,
                 force: bool = False, say: Callable[[str], None] = lambda m: None, metrics: Any = None) -> None:  # fmt: skip
        self.config, self.base, self.ctx_size, self.only, self.force, self.say = config, base, ctx_size, only, force, say
        self.metrics = metrics or Metrics()  # the server's, once it starts (its totals and ours are one count)
        self.router = Router(stop=Model.stop, active=lambda m: m.engine.running + m.engine.queued > 0, max_models=max_models,
                             keep_alive=keep_alive, max_queue=config.max_queue, say=say)  # fmt: skip
        self.hub: Any = None
        self.cores = Cores()  # a load's CPU, taken from the loaded models' threads while it runs
        self.installed = Installed()  # the servable names, and what each resolves to
        self.contexts: dict[str, int] = {}  # each model file's default context, sized once (a want that moved would reload it)

    # -- names ---------------------------------------------------------------------------------------
    def servable(self) -> list[str]:
        """The names a request may use: the installed models (and the registry default), read again
        when the manifest changed (a `pull` while serving)."""
        return list(self.only) if self.only is not None else self.installed.names()

    def resolve(self, name: str) -> tuple[str, ResolvedModel]:
        """The installed model ``name`` names (``name``, ``name:latest``), or a 404 naming the closest."""
        from localinfer.errors import LocalInferError
        from localinfer.fuzzy import rank
        from localinfer.store import resolve_model

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
            from localinfer.serve.model_map import target

            found = target(self.config.model_map, name, names)
        if found is None:
            closest = rank(name, names)[:1]
            hint = f" (the closest installed: {closest[0]})" if closest else " (no model is installed: `localinfer pull NAME`)"
            raise ApiError(404, f"model '{name}' not found{hint}", code="model_not_found", param="model")
        known = self.installed.resolved.get(found)
        if known is None:
            try:
                known = resolve_model(found, offline=True, auto_pull=False)
            except LocalInferError as exc:
                raise ApiError(404, f"model '{found}' cannot be served: {exc}", code="model_not_found", param="model") from None
            self.installed.resolved[found] = known
        return found, known

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
    async def engine_for(self, scope: dict[str, Any] | None, name: str | None, *, keep_alive: Any = None,
                         num_ctx: Any = None) -> tuple[Engine, str]:  # fmt: skip
        """The engine that answers ``name``, loaded if needed and held until the request's exchange
        ends (``Leases``); ``keep_alive`` and ``num_ctx``: Ollama's per-request fields."""
        from localinfer.errors import LocalInferError, ResourceError
        from localinfer.serve.pool import Want

        if name is None:  # no model named: the one used last, else the default
            recent = max(self.router.slots.values(), key=lambda s: s.info.last_used, default=None)
            name = recent.info.name if recent is not None else self._default()
        seconds = _keep_alive(keep_alive)
        # keyed by the file's content: two names of one file, or of two copies of it, share one load
        found, resolved, key = await asyncio.to_thread(self._located, name)
        asked = _num_ctx(num_ctx)
        ctx = asked or self.ctx_size or await asyncio.to_thread(self._default_ctx, resolved, found)
        fit.check_trained(found, resolved, ctx, num_ctx=asked is not None, force=self.force)
        mmproj = str(resolved.mmproj) if resolved.mmproj else None  # one file, another projector: reloaded
        options = {"mmproj": mmproj, "chat_format": getattr(resolved, "chat_format", None)}  # one file, two templates: reloaded
        want = Want(key=key, options=options, sequences=self.config.parallel, ctx_per_seq=ctx)
        check = None if self.force else (lambda w: fit.check_memory(self.router, self.base, resolved, found, w))
        try:
            slot, _ = await self.router.acquire(want, found, lambda w: self._make(resolved, found, w), keep_alive=seconds,
                                                check=check)  # fmt: skip
        except Busy:
            raise ApiError(503, f"too many requests wait for a model to load ({self.config.max_queue}): retry shortly",
                           type="unavailable_error", code="server_overloaded", headers={"Retry-After": "1"}) from None  # fmt: skip
        except ResourceError as exc:
            hint = f" ({exc.hint})" if getattr(exc, "hint", None) else ""
            raise ApiError(507, f"model '{found}' does not fit in memory: {exc}{hint}", type="server_error",
                           code="insufficient_memory") from None  # fmt: skip
        except LocalInferError as exc:
            raise ApiError(500, f"model '{found}' failed to load: {exc}", type="server_error", code="model_load_failed") from None
        if scope is not None:
            scope.setdefault(LEASES, []).append((self.router, slot))
        else:
            self.router.release(slot)
        return slot.held.engine, found

    def _located(self, name: str) -> tuple[str, ResolvedModel, str]:
        """:meth:`resolve`, and a load's key (:func:`load_key`): file system calls, off the loop."""
        found, resolved = self.resolve(name)
        return found, resolved, load_key(resolved)

    def _default(self) -> str:
        from localinfer.store.registry import load_registry

        return self.only[0] if self.only else load_registry().default

    def _make(self, resolved: ResolvedModel, name: str, want: Any) -> Model:
        """Load a model and start its engine (on the router's thread), as `serve -m` does."""
        from localinfer.batch import job as batchjob
        from localinfer.generate import loading

        options = batchjob.batch_load_options(self.base, parallel=want.sequences, ctx_per_seq=want.ctx_per_seq)
        t0 = time.perf_counter()
        with self.cores.loading():
            return self._started(resolved, name, want, loading.load(resolved, options, force=self.force), t0)

    def _started(self, resolved: ResolvedModel, name: str, want: Any, loaded: Any, t0: float) -> Model:
        """Check the template and start the model's engine (its threads kept by ``self.cores``)."""
        from localinfer.batch import job as batchjob
        from localinfer.serve.engine import Engine
        from localinfer.serve.record import UsageWriter
        from localinfer.usage.history import logging_enabled

        config = self.config
        try:
            batchjob.check_template(loaded)
        except BaseException:
            loaded.close()
            raise
        writer = UsageWriter(resolved, name, want.sequences, warn=self.say) if logging_enabled(config.no_log) else None
        self.metrics.loaded(name)

        def finished(ticket: Any, outcome: Any) -> None:
            self.metrics.finished(outcome, name)
            if writer is not None:
                writer.add(ticket, outcome)

        engine: Engine | None = None
        keep, leave = self.cores.keeper(loaded.model, lambda: engine is not None and engine.running > 0)
        flush = self.hub.flush

        def step() -> None:  # on the engine thread, before each decode
            keep()
            flush()

        engine = Engine(loaded, want.sequences, max_queue=config.max_queue, on_finish=finished, on_step=step, cache_bytes=config.cache_ram,
                        template_kwargs=config.chat_template_kwargs, embed_ctx=config.embedding_ctx,
                        on_embedded=writer.add_embedding if writer else None)  # fmt: skip
        engine.start()
        self.say(f"loaded {name} in {time.perf_counter() - t0:.2f} s: {want.sequences} sequences x {engine.n_ctx_seq} tokens")
        return Model(name, engine, writer, leave)

    async def run(self, preload: list[str], on_error: Callable[[BaseException], None]) -> None:
        """Load the -m models (kept loaded), then unload idle models as their keep-alive runs out."""
        from localinfer.errors import LocalInferError

        try:
            for name in preload:
                await self.engine_for(None, name, keep_alive=-1)
        except ApiError as exc:  # said as the command's error, not as an HTTP answer
            on_error(LocalInferError(f"-m {name}: {exc.message}"))
            return
        except BaseException as exc:
            on_error(exc)
            return
        await asyncio.to_thread(self._find_all)
        while True:
            await asyncio.sleep(TICK_S)
            await self.router.reap()

    def _find_all(self) -> None:
        """Find (and verify, the first time) every servable model now, so a first request pays only the load."""
        for name in self.servable():
            try:
                self.resolve(name)
            except ApiError:
                pass

    # -- listings and figures ----------------------------------------------------------------------------
    def loaded(self, *, aliases: bool = True) -> dict[str, Any]:
        """Each loaded model's slot under the name it was loaded for, and (``aliases``) under every
        other name of its file (the listings say each is loaded; /api/ps and /metrics count it once)."""
        slots = {s.info.name: s for s in self.router.slots.values()}
        if not aliases:
            return slots
        by_key = {s.key: s for s in self.router.slots.values()}
        for name, resolved in list(self.installed.resolved.items()):
            slot = by_key.get(load_key(resolved))
            if slot is not None:
                slots.setdefault(name, slot)
        return slots

    def openai_models(self, created: int) -> dict[str, Any]:
        from localinfer.serve import ollama_models as om

        loaded, data = self.loaded(), []
        vision = {m.name for m in om.catalog(None, ()) if m.vision}
        for name in self.servable():
            slot = loaded.get(name)
            meta = {"n_ctx_seq": slot.held.n_ctx_seq, "parallel": slot.info.sequences} if slot else {}
            meta["vision"] = name in vision
            data.append({"id": name, "object": "model", "created": created, "owned_by": "localinfer",
                         "status": {"value": "loaded" if slot else "unloaded"}, "meta": meta})  # fmt: skip
        return {"object": "list", "data": data}

    def tags(self) -> list[dict[str, Any]]:
        from localinfer.serve import ollama_models as om

        names, loaded = set(self.servable()), self.loaded()
        out = []
        for m in om.catalog(None, (), on_demand=True):
            tag = replace(m, served=m.name in names).tag()
            tag["localinfer"]["loaded"] = m.name in loaded
            out.append(tag)
        return out

    def ollama_ps(self) -> list[dict[str, Any]]:
        """``/api/ps``: each loaded model, and when it unloads (``expires_at``) if left idle."""
        import datetime as dt

        from localinfer.serve import ollama_models as om

        facts = {m.name: m for m in om.catalog(None, (), on_demand=True)}
        now, out = time.monotonic(), []
        for name, slot in self.loaded(aliases=False).items():
            engine = slot.held.engine
            entry = om.running(facts.get(name) or _facts(name, engine), engine.loaded, engine.n_ctx_seq)
            left = slot.info.unloads_in(now)
            if left != math.inf:
                when = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=left)
                entry["expires_at"] = when.replace(microsecond=0).isoformat().replace("+00:00", "Z")
            forever = slot.info.keep_alive == math.inf
            entry["localinfer"] = {"busy": slot.info.busy, "sequences": slot.info.sequences, "idle_s": round(slot.info.idle_for(now), 3),
                                   "keep_alive_s": None if forever else slot.info.keep_alive,
                                   "unloads_in_s": None if forever else round(left, 3)}  # fmt: skip
            out.append(entry)
        return out

    def gauges(self) -> Gauges:
        return Gauges.of([s.held.engine for s in self.router.slots.values()], self.router.waiting)

    def metrics_text(self, counts: dict[str, dict[str, int]]) -> str:
        """/metrics' figures by model (Prometheus labels), after the server's totals: ``counts``,
        ``Metrics``' per-model counters read with the totals (they add up to them)."""
        p = "localinfer_model_"
        loaded = self.loaded(aliases=False)
        lines: list[str] = []
        rows = [("loaded", "gauge", "1 while the model is loaded.", lambda n, s, c: int(s is not None)),
                ("requests_running", "gauge", "Requests decoding now.", lambda n, s, c: s.held.engine.running if s else 0),
                ("requests_queued", "gauge", "Requests waiting for a sequence.", lambda n, s, c: s.held.engine.queued if s else 0),
                ("loads_total", "counter", "Times the model was loaded.", lambda n, s, c: c.get("loads", 0)),
                ("requests_finished_total", "counter", "Requests that left its engine.", lambda n, s, c: c.get("finished", 0)),
                ("prompt_tokens_total", "counter", "Prompt tokens.", lambda n, s, c: c.get("prompt", 0)),
                ("completion_tokens_total", "counter", "Tokens generated.", lambda n, s, c: c.get("completion", 0))]  # fmt: skip
        names = sorted(set(counts) | set(loaded))
        for metric, kind, text, value in rows:
            lines += [f"# HELP {p}{metric} {text}", f"# TYPE {p}{metric} {kind}"]
            lines += [f'{p}{metric}{{model="{n}"}} {value(n, loaded.get(n), counts.get(n, {}))}' for n in names]
        return "\n".join(lines) + "\n"


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
            for router, slot in held:
                router.release(slot)
            held.clear()


def load_key(resolved: ResolvedModel) -> str:
    """What one loaded model answers for: the file's verified digest (a model pulled from the shipped
    file is a copy of it), else its real path (links to one file)."""
    digest = getattr(resolved, "sha256", None)
    return f"sha256:{digest}" if digest else os.path.realpath(resolved.path)


def _keep_alive(value: Any) -> float | None:
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


def _num_ctx(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 16:
        raise ApiError(400, f"'options.num_ctx' must be a whole number of tokens, at least 16, not {value!r}", param="num_ctx")
    return value




def _facts(name: str, engine: Engine) -> Any:
    from localinfer.serve import ollama_models as om

    return om._of_loaded(engine.loaded, (name,))
