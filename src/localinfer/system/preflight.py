"""Before loading: pick the context size and GPU layers, and refuse what will not fit in memory.

:func:`plan_load` turns the user's options (``--ctx-size`` or the default, ``--gpu-layers
auto|all|N``) and the machine's :class:`~localinfer.system.hardware.MemoryBudget` into a :class:`LoadPlan`:
the exact ``n_ctx`` and ``n_gpu_layers`` to hand llama.cpp, with the memory estimate behind them.
When the estimate exceeds what is available it raises :class:`ResourceError` (exit 6) with the
figures and what to change, unless ``force``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localinfer.engine.types import DEFAULT_CTX_CEILING, LoadOptions
from localinfer.errors import ResourceError, UsageError
from localinfer.system import estimate as est
from localinfer.system.estimate import CTX_PAD, DEFAULT_GPU_HEADROOM, GPU_LAYERS_AUTO, Estimate, ModelShape, ShapeError
from localinfer.units import human_bytes as human

if TYPE_CHECKING:
    from localinfer.gguf import GGUFInfo
    from localinfer.system.hardware import MemoryBudget

MIN_DEFAULT_CTX = 512  # the default context is reduced to fit memory, but not below this
# serve's default context per sequence, at most: what coding agents need (Claude Code's default request is
# ~21k tokens before the conversation; Ollama's `launch` warns below 64k). The model's trained context
# and the memory decide below it (serve_context).
SERVE_CTX_CEILING = 65536
_QUANTIZED = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")


@dataclass(frozen=True)
class LoadPlan:
    """What to ask llama.cpp for, and why."""

    n_ctx: int | None  # None: let the engine decide (no estimate possible)
    ctx_source: str  # "--ctx-size" | "default" | "default, reduced to fit memory"
    n_ctx_train: int
    n_gpu_layers: int  # for llama.cpp: 0..n_layer+1, or -1 (all) when the shape is unknown
    gpu_layers_requested: str  # auto | all | N
    n_offloadable: int | None  # n_layer + 1
    estimate: Estimate | None
    budget: MemoryBudget
    notes: tuple[str, ...] = ()  # warnings for the user
    forced: bool = False  # the estimate did not fit and --force loaded anyway

    def apply(self, options: LoadOptions) -> LoadOptions:
        """The options with this plan's context and GPU layers."""
        return dataclasses.replace(options, n_ctx=self.n_ctx if self.n_ctx else options.n_ctx, n_gpu_layers=self.n_gpu_layers)

    def to_json(self) -> dict:
        return {
            "n_ctx_source": self.ctx_source,
            "gpu_layers_requested": self.gpu_layers_requested,
            "estimate": self.estimate.to_json() if self.estimate else None,
            "available": {"ram_bytes": self.budget.ram_available, "vram_bytes": self.budget.vram_free},
            "forced": self.forced,
        }


def gpu_layers_label(n: int) -> str:
    return "auto" if n == GPU_LAYERS_AUTO else "all" if n < 0 else str(n)


def _est_kwargs(options: LoadOptions) -> dict:
    return {
        "n_batch": options.n_batch,
        "n_ubatch": options.n_ubatch,
        "n_seq_max": options.n_seq_max,
        "cache_type_k": options.cache_type_k,
        "cache_type_v": options.cache_type_v,
        "flash_attn": options.flash_attn,
    }


def _cpu_need(e: Estimate, budget: MemoryBudget) -> int:
    """Host memory the estimate takes from the RAM budget (all of it on unified memory)."""
    return _room(budget).host_need(e)


def ram_margin(budget: MemoryBudget) -> int:
    """RAM kept free beyond the estimate: the OS, page cache and the estimate's own error need room
    (a load that takes all but the last few hundred MB of a machine makes it swap or die)."""
    return min(1 << 30, budget.ram_available // 10)


def _room(budget: MemoryBudget) -> est.Room:
    """What the estimate may fill: the free RAM less the margin, the free VRAM."""
    return est.Room(budget.ram_available - ram_margin(budget), budget.vram_free, budget.unified)


def other_shard_tensors(info: GGUFInfo) -> list:
    """The tensors of a split model's other shards (``name-00001-of-00003.gguf``), headers only."""
    from localinfer.errors import LocalInferError
    from localinfer.gguf import read_gguf

    n = info.split_count or 1
    m = re.search(r"-(\d{5})-of-(\d{5})\.gguf$", info.path.name)
    if n <= 1 or not m:
        return []
    out: list = []
    for i in range(1, n + 1):
        if i == int(m.group(1)):
            continue
        shard = info.path.with_name(f"{info.path.name[: m.start()]}-{i:05d}-of-{m.group(2)}.gguf")
        try:
            out.extend(read_gguf(shard).tensors)
        except LocalInferError:
            pass  # llama.cpp will say which shard is missing
    return out


@dataclass(frozen=True)
class ServeContext:
    """Each sequence's context when serve is given no ``-c``, and why (said at start)."""

    per_seq: int
    why: str


def default_cache_ram(budget: MemoryBudget | None = None) -> int:
    """serve's host prompt cache, per model, by default: llama-server's 8 GiB, at most a quarter of the
    memory free now (serve_context leaves it out of what the context may take). Without ``budget``,
    psutil's figures: a flag's mistake is said before llama.cpp loads."""
    if budget is None:
        from localinfer.system.hardware import host_room

        ram, swap, _total, _notes = host_room()
        return max(0, min(8 << 30, (ram + swap) // 4))
    return max(0, min(8 << 30, budget.ram_available // 4))


def serve_context(info: GGUFInfo, options: LoadOptions, parallel: int, *, budget: MemoryBudget | None = None,
                  reserved: int = 0) -> ServeContext:  # fmt: skip
    """The model's trained context, at most SERVE_CTX_CEILING, for each of ``parallel`` sequences,
    reduced to what the memory pre-flight finds room for (as Ollama sizes by memory and llama-server
    fits its context), never below what ``run`` takes by default unless memory cannot hold even that
    (then the load's own pre-flight says so). A model whose shape we cannot read gets run's default.
    ``reserved``: host bytes kept for something else (the prompt cache)."""
    train = info.context_length or 0
    fallback = min(train or DEFAULT_CTX_CEILING, DEFAULT_CTX_CEILING)
    upper = min(train, SERVE_CTX_CEILING) // CTX_PAD * CTX_PAD if train else fallback
    if upper <= fallback:
        return ServeContext(upper, f"the {train} tokens the model was trained on" if train else "run's default")
    try:
        shape = ModelShape.from_gguf(info, other_shard_tensors(info))
    except ShapeError:
        return ServeContext(fallback, "run's default (the model's shape is unknown: no memory estimate)")
    if budget is None:
        from localinfer.system.hardware import memory_budget

        budget = memory_budget()
    budget = dataclasses.replace(budget, ram_available=max(0, budget.ram_available - reserved))
    kw = _est_kwargs(dataclasses.replace(options, n_seq_max=parallel, n_batch=max(options.n_batch, parallel)))
    total = est.largest_ctx(shape, _room(budget), upper=upper * parallel, n_gpu_layers=_layers(options, budget, shape), **kw)
    per_seq = total // parallel // CTX_PAD * CTX_PAD
    said = (f"the {train} tokens the model was trained on" if upper == train
            else f"at most {SERVE_CTX_CEILING} (what coding agents need; trained on {train})")  # fmt: skip
    if per_seq >= upper:
        return ServeContext(upper, said)
    if per_seq <= fallback:
        return ServeContext(fallback, f"run's default: memory holds no more ({human(_room(budget).ram)} free)")
    return ServeContext(per_seq, f"reduced to fit memory: {parallel} sequence{'s' * (parallel != 1)} in {human(_room(budget).ram)} free; "
                                 f"-c {upper} would need more")  # fmt: skip


def largest_ctx(shape: ModelShape, budget: MemoryBudget, *, upper: int, n_gpu_layers: int, **kw) -> int:
    """The largest context (a multiple of 256, at most ``upper``) that fits the budget; 0 if none."""
    return est.largest_ctx(shape, _room(budget), upper=upper, n_gpu_layers=n_gpu_layers, **kw)


def _layers(options: LoadOptions, budget: MemoryBudget, shape: ModelShape) -> int:
    """The GPU layers asked for, as the estimate takes them (GPU_LAYERS_AUTO: fitted to the context)."""
    if not budget.gpu_offload:
        return 0
    if options.n_gpu_layers == GPU_LAYERS_AUTO:
        return GPU_LAYERS_AUTO if budget.vram_free is not None else 0
    if options.n_gpu_layers < 0:
        return shape.n_offloadable
    return min(options.n_gpu_layers, shape.n_offloadable)


def plan_load(
    info: GGUFInfo,
    options: LoadOptions,
    *,
    budget: MemoryBudget | None = None,
    name: str | None = None,
    force: bool = False,
    ceiling: int = DEFAULT_CTX_CEILING,
    extra_tensors: Iterable | None = None,
    headroom: int = DEFAULT_GPU_HEADROOM,
) -> LoadPlan:
    """Context size and GPU layers for this load; ResourceError when it cannot fit (unless ``force``)."""
    if options.flash_attn == "off" and options.cache_type_v in _QUANTIZED:
        raise UsageError(
            f"--cache-type-v {options.cache_type_v} needs flash attention, and --flash-attn is off",
            hint="use --flash-attn auto (or on), or --cache-type-v f16",
        )
    if budget is None:
        from localinfer.system.hardware import memory_budget

        budget = memory_budget()
    name = name or info.path.name
    requested = gpu_layers_label(options.n_gpu_layers)
    notes: list[str] = []
    cpus = os.cpu_count() or 0
    if options.n_threads and cpus and options.n_threads > cpus:
        notes.append(f"--threads {options.n_threads} is more than this machine's {cpus} CPU threads: llama.cpp "
                     "slows down when its threads outnumber the cores")  # fmt: skip
    if not budget.gpu_offload and requested != "auto" and options.n_gpu_layers != 0:
        notes.append(
            f"this llama-cpp-python build cannot offload to a GPU; --gpu-layers {requested} is ignored "
            "(see `localinfer doctor`)"
        )
    try:
        extra = other_shard_tensors(info) if extra_tensors is None else extra_tensors
        shape = ModelShape.from_gguf(info, extra)
    except ShapeError:
        # Unknown layout: no estimate, llama.cpp decides (and its own errors are diagnosed on load).
        layers = 0 if not budget.gpu_offload else (-1 if options.n_gpu_layers == GPU_LAYERS_AUTO else options.n_gpu_layers)
        return LoadPlan(options.n_ctx, "--ctx-size" if options.n_ctx else "default", info.context_length or 0,
                        layers, requested, None, None, budget, tuple(notes))

    kw = _est_kwargs(options)
    train = shape.n_ctx_train or ceiling
    per_seq = (options.n_ctx or 0) // max(1, options.n_seq_max)  # each sequence's share, as llama.cpp splits it
    if per_seq > shape.n_ctx_train > 0:
        if not force:
            raise UsageError(
                f"--ctx-size {per_seq} is beyond the {shape.n_ctx_train} tokens {name} was trained on",
                hint=f"use --ctx-size {shape.n_ctx_train} or less, or --force to go beyond it (answers degrade there)",
            )
        notes.append(f"--ctx-size {per_seq} is beyond the {shape.n_ctx_train} tokens this model was trained on (--force)")
    if options.n_ctx:
        n_ctx, source = options.n_ctx, "--ctx-size"
    else:
        n_ctx, source = min(train, ceiling), "default"

    # One question to the estimate: what fits (the default context may shrink), and the figures
    # for a refusal. Auto leaves its headroom on each device, as llama.cpp's --fit does.
    sizing = est.size_load(
        shape, _room(budget), n_ctx=n_ctx, n_gpu_layers=_layers(options, budget, shape),
        shrink_to=MIN_DEFAULT_CTX if source == "default" else None, auto_headroom=headroom * budget.gpu_devices, **kw,
    )  # fmt: skip
    if sizing.reduced:
        source = "default, reduced to fit memory"
    if not sizing.fits:
        if not force:
            raise _not_enough(name, shape, sizing, budget, options)
        notes.append("the memory estimate exceeds what is available; loading anyway (--force)")
    return LoadPlan(sizing.n_ctx, source, shape.n_ctx_train, sizing.n_gpu_layers, requested, shape.n_offloadable,
                    sizing.estimate, budget, tuple(notes), forced=not sizing.fits)  # fmt: skip


def _not_enough(name: str, shape: ModelShape, s: est.Sizing, budget: MemoryBudget, options: LoadOptions) -> ResourceError:
    e, k, n_ctx = s.estimate, s.n_gpu_layers, s.n_ctx
    parts = f"weights {human(e.weights)}, KV cache {human(e.kv)}, compute {human(e.compute + e.output)}"
    advice: list[str] = []
    cpu_short = _cpu_need(e, budget) > budget.ram_available
    if cpu_short:
        avail = human(budget.ram_available)
        if budget.swap_free:
            avail += " (RAM and swap)"
        message = (
            f"not enough memory for {name} with a {n_ctx}-token context: it needs about "
            f"{human(_cpu_need(e, budget))} ({parts}"
            + (f"; {human(e.gpu_bytes)} of it on the GPU" if e.gpu_bytes and not budget.unified else "")
            + f"), and {avail} is available"
        )
    else:
        message = (
            f"not enough GPU memory for {name} with {k} of {shape.n_offloadable} layers offloaded: it needs about "
            f"{human(e.gpu_bytes)} on the GPU ({parts} in all), and {human(budget.vram_free)} is free"
        )
        advice.append(f"fewer --gpu-layers (about {s.max_gpu_layers} fit), or --gpu-layers auto")
    if cpu_short:
        fit_ctx = s.max_ctx or 0
        if fit_ctx >= CTX_PAD and e.kv > 0:
            trained = f"this model was trained on {shape.n_ctx_train}; " if 0 < shape.n_ctx_train < e.n_ctx else ""
            advice.append(f"a smaller --ctx-size ({trained}about {fit_ctx} tokens fit)")
        if options.cache_type_k == "f16" and options.cache_type_v == "f16" and e.kv > e.weights:
            advice.append("a quantized KV cache (--cache-type-k q8_0 --cache-type-v q8_0 halves it)")
        if e.weights > budget.ram_available / 2:
            advice.append("a smaller quantization or a smaller model")
        if budget.gpu_offload and budget.vram_free and k < shape.n_offloadable and not budget.unified:
            advice.append("more --gpu-layers")
    advice.append("--force to try anyway")
    hint = "use " + ", ".join(advice[:-1]) + "; or " + advice[-1] if len(advice) > 1 else "pass " + advice[0]
    return ResourceError(message, hint=hint)


def less_projector(budget: MemoryBudget, nbytes: int) -> MemoryBudget:
    """``budget`` less what a multimodal projector of ``nbytes`` takes (its weights, and its compute
    buffer: half as much again, at least 64 MiB), on the CPU where libmtmd keeps it without offload."""
    need = nbytes + max(64 << 20, nbytes // 2)
    return less(budget, f"the projector (images in) takes about {human(need)} of it", ram=need)


def less(budget: MemoryBudget, note: str, *, ram: int, vram: int = 0) -> MemoryBudget:
    """``budget`` less what something loaded beside the model takes (``note`` says what, for the
    pre-flight's message): ``ram`` bytes of memory, ``vram`` of the GPU's."""
    changes = {"ram_available": max(0, budget.ram_available - ram)}
    if vram and budget.vram_free is not None:
        changes["vram_free"] = max(0, budget.vram_free - vram)
    return dataclasses.replace(budget, notes=(*budget.notes, note), **changes)
