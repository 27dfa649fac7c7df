"""Loading a model for ``serve`` and starting its engine (``make``, on the router's thread): the
load options the command's flags and the request's want give, the template checked, the usage
writer, the engine with its share of the CPUs (``serve.models.cores``); what the router keeps of it
(``LoadedEngine``); a load's failure as a request's answer (``load_error``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.serve.wires.openai import ApiError

if TYPE_CHECKING:
    from localinfer.engine.types import LoadOptions
    from localinfer.serve.scheduler.worker import Engine
    from localinfer.store import ResolvedModel

CPU_MAX_MODELS = 3  # as Ollama: on CPU at most this many at once unless --max-models says otherwise


@dataclass
class LoadedEngine:
    """What the router keeps for one loaded model: its engine, what records its answers, its CPU share."""

    name: str
    engine: Engine
    writer: Any = None  # record.UsageWriter, or None with --no-log
    leave: Callable[[], None] | None = None  # its CPU share ends (serve.models.cores)

    @property
    def n_ctx_seq(self) -> int:
        return self.engine.n_ctx_seq

    def stop(self) -> None:
        if self.leave is not None:
            self.leave()
        self.engine.stop()
        if self.writer is not None:
            self.writer.close()


def default_max_models(base: LoadOptions) -> int | None:
    """As many as fit (the pre-flight decides), and at most 3 when nothing runs on a GPU."""
    if base.n_gpu_layers == 0:
        return CPU_MAX_MODELS
    from localinfer.system.hardware import gpus

    try:
        return None if gpus() else CPU_MAX_MODELS
    except Exception:
        return CPU_MAX_MODELS


def make(served: Any, resolved: ResolvedModel, name: str, want: Any) -> LoadedEngine:
    """Load a model and start its engine (on the router's thread), sized by ``want``, for ``served``
    (a ``multi.Served``: its flags, CPUs, figures and log)."""
    from localinfer.batch import job as batchjob
    from localinfer.generate import loading

    options = batchjob.batch_load_options(served.base, parallel=want.sequences, ctx_per_seq=want.ctx_per_seq)
    t0 = time.perf_counter()
    with served.cores.loading():
        return _started(served, resolved, name, want, loading.load(resolved, options, force=served.force), t0)

def _started(served: Any, resolved: ResolvedModel, name: str, want: Any, loaded: Any, t0: float) -> LoadedEngine:
    """Check the template and start the model's engine (its threads kept by ``served.cores``)."""
    from localinfer.batch import job as batchjob
    from localinfer.serve.scheduler.worker import Engine
    from localinfer.serve.scheduler.record import UsageWriter
    from localinfer.usage.history import logging_enabled

    config = served.config
    try:
        batchjob.check_template(loaded)  # a template the sandbox refuses fails now, not per request
        if served.stopping:
            raise Stopped()
    except BaseException:
        loaded.close()
        raise
    writer = UsageWriter(resolved, name, want.sequences, warn=served.say) if logging_enabled(config.no_log) else None
    served.metrics.loaded(name)

    def finished(ticket: Any, outcome: Any) -> None:
        served.metrics.finished(outcome, name)
        if writer is not None:
            writer.add(ticket, outcome)

    engine: Engine | None = None
    keep, leave = served.cores.keeper(loaded.model, lambda: engine is not None and engine.running > 0)
    flush = served.hub.flush

    def step() -> None:  # on the engine thread, before each decode
        keep()
        flush()

    engine = Engine(loaded, want.sequences, max_queue=config.max_queue, on_finish=finished, on_step=step, cache_bytes=config.cache_ram,
                    template_kwargs=config.chat_template_kwargs, n_predict=config.n_predict, embed_ctx=config.embedding_ctx,
                    on_embedded=writer.add_embedding if writer else None)  # fmt: skip
    engine.start()
    took = time.perf_counter() - t0
    if served.pin is not None:
        served.say(f"ready: {name} loaded in {took:.1f} s, {want.sequences} sequences x {engine.n_ctx_seq} tokens")
    else:
        served.say(f"loaded {name} in {took:.2f} s: {want.sequences} sequences x {engine.n_ctx_seq} tokens")
    return LoadedEngine(name, engine, writer, leave)


class Stopped(Exception):
    """A load that ended while the server was stopping: dropped, not an error."""


def load_error(name: str, exc: Exception) -> Exception:
    """A load's failure as the request's answer: 507 for memory, 500 for the rest (an ApiError as it is)."""
    from localinfer.errors import LocalInferError, ResourceError

    if isinstance(exc, ResourceError):
        hint = f" ({exc.hint})" if getattr(exc, "hint", None) else ""
        return ApiError(507, f"model '{name}' does not fit in memory: {exc}{hint}", type="server_error", code="insufficient_memory")
    if isinstance(exc, LocalInferError):
        return ApiError(500, f"model '{name}' failed to load: {exc}", type="server_error", code="model_load_failed")
    return exc
