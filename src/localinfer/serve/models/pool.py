"""Which loaded model answers a request, and when one is reloaded or unloaded: plain logic on plain
values (the server applies it). Sampling never reloads; a larger context, more sequences or other
load options do; a smaller context reuses what is loaded."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# LoadOptions fields that the resident request sizes itself, or that change nothing once loaded
_SIZING = ("n_ctx", "n_seq_max", "verbose")
_FLAG = {"n_threads": "--threads", "n_threads_batch": "--threads", "n_gpu_layers": "--gpu-layers",
         "cache_type_k": "--cache-type-k", "cache_type_v": "--cache-type-v", "flash_attn": "--flash-attn",
         "use_mmap": "--no-mmap", "use_mlock": "--mlock", "n_batch": "--batch-size", "cpu_repack": "--cpu-repack",
         "rpc_servers": "--rpc"}  # fmt: skip


@dataclass(frozen=True)
class Want:
    """What a request needs loaded: the model, its load options, sequences and context per sequence."""

    key: str  # the model file (absolute path), or its content (serve.models.multi.load_key)
    options: dict[str, Any]  # LoadOptions fields but the sizing ones
    sequences: int = 1
    ctx_per_seq: int = 4096  # the context the command would have loaded (its -c, else its default)


@dataclass
class Loaded:
    """What a loaded model was loaded with, and how it is used (times: ``time.monotonic()``)."""

    key: str
    name: str
    options: dict[str, Any]
    sequences: int
    ctx_asked: int  # per sequence, as asked (the pre-flight may have made it smaller to fit)
    n_ctx_seq: int  # per sequence, as loaded
    keep_alive: float  # seconds (math.inf: forever)
    last_used: float
    busy: int = 0  # requests in flight

    def idle_for(self, now: float) -> float:
        return 0.0 if self.busy else max(0.0, now - self.last_used)

    def unloads_in(self, now: float) -> float:
        return self.keep_alive if self.busy else max(0.0, self.keep_alive - self.idle_for(now))


def load_fields(options: Any) -> dict[str, Any]:
    """The load options that decide whether a loaded model can answer (a LoadOptions, as a dict)."""
    fields = dataclasses.asdict(options) if dataclasses.is_dataclass(options) else dict(options)
    for name in _SIZING:
        fields.pop(name, None)
    if isinstance(fields.get("rpc_servers"), list):
        fields["rpc_servers"] = tuple(fields["rpc_servers"])
    return fields


def reload_reason(loaded: Loaded, want: Want) -> str | None:
    """Why ``loaded`` cannot answer ``want`` (a one-line reason), or None when it can as it is."""
    for name, value in want.options.items():
        if loaded.options.get(name) != value:
            flag = _FLAG.get(name, name)
            return f"{flag} {_shown(value)} differs from the loaded {_shown(loaded.options.get(name))}"
    if want.ctx_per_seq > max(loaded.ctx_asked, loaded.n_ctx_seq):
        return f"a context of {want.ctx_per_seq} tokens is more than the loaded {loaded.n_ctx_seq}"
    if want.sequences > loaded.sequences:
        return f"{want.sequences} sequences are more than the loaded {loaded.sequences}"
    return None


def grown(loaded: Loaded, want: Want) -> Want:
    """What to reload with: the request's options, and no less room than the model had."""
    return dataclasses.replace(want, sequences=max(want.sequences, loaded.sequences),
                               ctx_per_seq=max(want.ctx_per_seq, loaded.ctx_asked))  # fmt: skip


def victims(models: list[Loaded], *, max_models: int | None, adding: bool) -> list[Loaded]:
    """The models to unload before loading one more (least recently used first, busy ones never)."""
    if not adding or max_models is None:
        return []
    excess = len(models) + 1 - max_models
    idle = sorted((m for m in models if not m.busy), key=lambda m: m.last_used)
    return idle[:max(0, excess)]


def expired(models: list[Loaded], now: float) -> list[Loaded]:
    """Idle models whose keep-alive has run out."""
    return [m for m in models if not m.busy and now - m.last_used >= m.keep_alive]


def _shown(value: Any) -> str:
    if value is None:
        return "default"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)
