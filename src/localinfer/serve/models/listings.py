"""What the server says of its models, in each API's listing: OpenAI's ``/v1/models``, Ollama's
``/api/tags`` and ``/api/ps`` (the facts ``/api/show`` starts from), and ``/metrics``' figures per
model. Read from ``multi.Served`` (what it serves, what its router keeps loaded) and the store's
manifest (``ollama_models.catalog``): call these off the event loop.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from typing import TYPE_CHECKING, Any

from localinfer.serve.wires.ollama import models as om
if TYPE_CHECKING:
    from localinfer.serve.scheduler.worker import Engine
    from localinfer.serve.models.multi import Served
    from localinfer.serve.models.router import KeptModel


def catalog(served: Served) -> list[om.ListedModel]:
    """The installed models, those this server answers marked ``served``: the pinned model first
    (under the store's name when it is installed), else every installed one."""
    pin = served.pin
    if pin is None:
        return om.catalog(None, (), on_demand=True)
    kept = served.router.slots.get(pin.key)
    return om.catalog(kept.held.engine.loaded if kept is not None else None, pin.names)


def loaded_as(served: Served, facts: om.ListedModel) -> KeptModel | None:
    """The loaded model ``facts`` describes (by its name or another of its file's), None when not loaded."""
    loaded = served.loaded()
    return next((loaded[n] for n in (facts.name, *facts.aliases) if n in loaded), None)


def openai_models(served: Served, created: int) -> dict[str, Any]:
    loaded, data = served.loaded(), []
    vision = {m.name for m in om.catalog(None, ()) if m.vision}
    for name in served.servable():
        kept = loaded.get(name)
        if kept is not None:
            engine = kept.held.engine
            meta = {"n_ctx_seq": engine.n_ctx_seq, "parallel": kept.info.sequences, "vision": name in vision or engine.vision}
        else:
            meta = {"vision": name in vision} | ({} if served.ready() else {"loading": True})
        data.append({"id": name, "object": "model", "created": created, "owned_by": "localinfer",
                     "status": {"value": "loaded" if kept else "unloaded"}, "meta": meta})  # fmt: skip
    return {"object": "list", "data": data}


def tags(served: Served) -> list[dict[str, Any]]:
    out = []
    for m in catalog(served):
        tag = m.tag()
        tag["localinfer"]["loaded"] = loaded_as(served, m) is not None
        out.append(tag)
    return out


def ollama_ps(served: Served) -> list[dict[str, Any]]:
    """``/api/ps``: each loaded model, and when it unloads (``expires_at``) if left idle."""
    models = catalog(served)
    now, out = time.monotonic(), []
    for name, kept in served.loaded(aliases=False).items():
        engine = kept.held.engine
        entry = om.running(om.find(models, name) or _facts(name, engine), engine.loaded, engine.n_ctx_seq)
        left = kept.info.unloads_in(now)
        if left != math.inf:
            when = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=left)
            entry["expires_at"] = when.replace(microsecond=0).isoformat().replace("+00:00", "Z")
        forever = kept.info.keep_alive == math.inf
        entry["localinfer"] = {"busy": kept.info.busy, "sequences": kept.info.sequences, "idle_s": round(kept.info.idle_for(now), 3),
                               "keep_alive_s": None if forever else kept.info.keep_alive,
                               "unloads_in_s": None if forever else round(left, 3)}  # fmt: skip
        out.append(entry)
    return out


def metrics_text(served: Served, counts: dict[str, dict[str, int]]) -> str:
    """/metrics' figures by model (Prometheus labels), after the server's totals: ``counts``,
    ``Metrics``' per-model counters read with the totals (they add up to them)."""
    p = "localinfer_model_"
    loaded = served.loaded(aliases=False)
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


def _facts(name: str, engine: Engine) -> om.ListedModel:
    return om._of_loaded(engine.loaded, (name,))
