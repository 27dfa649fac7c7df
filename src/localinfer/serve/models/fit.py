"""Whether a load that serving several models is asked for can happen, decided before the router
unloads anything for it: a context beyond what the model was trained on (a 400 naming the field and
the limit), and a model that would not fit even with every idle model unloaded (the pre-flight's
``ResourceError``). A request that cannot be answered never costs other clients their model.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer.serve.wires.openai import ApiError

if TYPE_CHECKING:
    from localinfer.engine.types import LoadOptions
    from localinfer.serve.models.router import Router
    from localinfer.store import ResolvedModel


def check_trained(name: str, resolved: ResolvedModel, ctx: int, *, num_ctx: bool, force: bool) -> None:
    """A 400 when ``ctx`` (per sequence) is beyond the model's trained context, unless ``--force``
    (as the pre-flight: beyond it answers degrade). ``num_ctx``: the request asked for it."""
    n_train = getattr(resolved.info, "context_length", None) or 0
    if force or not ctx > n_train > 0:
        return
    if num_ctx:
        raise ApiError(400, f"'options.num_ctx' {ctx} is beyond the {n_train} tokens {name} was trained on: "
                            f"ask for {n_train} or less", param="num_ctx")  # fmt: skip
    raise ApiError(400, f"model '{name}' was trained on {n_train} tokens, fewer than this server's --ctx-size {ctx}: "
                        f"serve it with --ctx-size {n_train} or less, or with --force to go beyond", param="model")  # fmt: skip


def start_warning(ctx: int | None, names: list[str], *, force: bool) -> str | None:
    """At start, the ``names`` whose trained context (the manifest's header: no model file read) is
    below ``--ctx-size``, and what their requests get; None when there are none."""
    from localinfer.serve.wires.ollama import models as om
    if not ctx:
        return None
    wanted = set(names)
    short = [f"{m.name} ({m.context_length})" for m in om.catalog(None, ())
             if m.name in wanted and m.context_length and m.context_length < ctx]  # fmt: skip
    if not short:
        return None
    then = "served beyond it (--force): answers may degrade" if force else "requests for them are refused (400) unless --force"
    return f"--ctx-size {ctx} is beyond the tokens these were trained on: {', '.join(short)}; {then}"


def check_memory(router: Router, base: LoadOptions, resolved: ResolvedModel, name: str, want: Any) -> None:
    """The pre-flight's ``ResourceError`` when ``want`` would not fit even in the memory every idle
    model gives back: then unloading them (other clients' models) cannot help. On a router thread."""
    from localinfer.batch import job as batchjob
    from localinfer.errors import ResourceError
    from localinfer.system import hardware, preflight

    if getattr(base, "rpc_servers", None):  # remote devices' memory: the load's own pre-flight asks them
        return
    ram = vram = 0
    for slot in list(router.slots.values()):
        if not router.busy(slot):
            host, gpu = _held_bytes(slot.held)
            ram, vram = ram + host, vram + gpu
    try:
        options = batchjob.batch_load_options(base, parallel=want.sequences, ctx_per_seq=want.ctx_per_seq)
        budget = hardware.memory_budget()
        budget = dataclasses.replace(budget, ram_available=budget.ram_available + ram,
                                     vram_free=None if budget.vram_free is None else budget.vram_free + vram)  # fmt: skip
        if resolved.mmproj is not None:
            budget = preflight.less_projector(budget, Path(resolved.mmproj).stat().st_size)
        preflight.plan_load(resolved.info, options, budget=budget, name=name)
    except ResourceError:
        raise
    except Exception:  # an estimate we cannot make refuses nothing: the load's own pre-flight decides
        return


def _held_bytes(held: Any) -> tuple[int, int]:
    """What a loaded model takes (RAM, GPU), as llama.cpp reported its buffers, else its file's size."""
    loaded = getattr(getattr(held, "engine", None), "loaded", None)
    buffers = getattr(loaded, "buffers", None)
    if buffers is not None and buffers.buffers:
        return buffers.total(host=True), buffers.total(host=False)
    resolved = getattr(loaded, "resolved", None)
    try:
        return (Path(resolved.path).stat().st_size if resolved is not None else 0), 0
    except OSError:
        return 0, 0
