"""How much memory a model will take in llama.cpp, from its GGUF header alone (no loading).

Mirrors how llama.cpp sizes its buffers, so that we can refuse before an allocation fails and pick
how many layers fit on a GPU:

* weights: the tensors' bytes, per repeating layer (``blk.N.*``), the output layer (``output*``; for
  models with tied embeddings a copy of ``token_embd`` when the output layer is offloaded) and the
  input embeddings (always on the CPU);
* KV cache: ``2 x cells x n_head_kv x head_dim x bytes per element`` per layer, where cells is the
  context padded to 256; sliding-window layers (gemma2/3, cohere2, gpt-oss) take the full context
  when ``swa_full`` (llama.cpp's library default, which our engine keeps) or else the window plus
  one ubatch, padded;
* compute buffer: the larger of the output phase (``n_ubatch x (n_vocab + 2 n_embd)`` floats) and
  the attention phase (masks, and the KQ matrix without flash attention);
* output buffer: one row of logits per sequence.

Checked against the buffer sizes llama.cpp logs (tests/test_estimate_models.py). Pure arithmetic: no
llama_cpp here. The pre-flight asks one question per load, :func:`size_load`: the context and GPU
layers that fit a :class:`Room`, and the figures a refusal quotes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localinfer.engine.types import GPU_LAYERS_AUTO  # LoadOptions' value, defined with it
from localinfer.gguf import ggml_type_size
# What llama.cpp reported of the same buffers lives in system/buffers.py; importable here as before.
from localinfer.system.buffers import BufferReport, parse_buffer_report  # noqa: F401

if TYPE_CHECKING:
    from localinfer.gguf import GGUFInfo

GiB = 1 << 30
CTX_PAD = 256  # llama.cpp pads the context (per sequence) to a multiple of this
DEFAULT_GPU_HEADROOM = GiB  # what auto leaves free on the GPU (llama.cpp's --fit leaves 1 GiB too)

# Sliding-window layout llama.cpp hard-codes per architecture (set_swa_pattern): layer il uses the
# window when il % n < n - 1.
_SWA_PATTERNS = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "cohere2": 4, "gpt-oss": 2}


class ShapeError(ValueError):
    """The header lacks what the estimate needs (an architecture we cannot size)."""


def _pad(n: int, to: int = CTX_PAD) -> int:
    return -(-n // to) * to


def _per_layer(value: object, n_layer: int, what: str) -> tuple[int, ...]:
    if isinstance(value, bool):
        raise ShapeError(f"bad {what}")
    if isinstance(value, int):
        return (value,) * n_layer
    if isinstance(value, list) and len(value) == n_layer and all(isinstance(v, int) for v in value):
        return tuple(value)
    raise ShapeError(f"missing or unusable {what}")


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs from a GGUF header."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int  # the largest over layers
    n_head_kv: tuple[int, ...]  # per layer (0 for layers without attention)
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    n_ctx_train: int
    n_swa: int  # sliding window, 0 when none
    swa_layers: tuple[bool, ...]
    layer_bytes: tuple[int, ...]  # weights of each repeating layer
    input_bytes: int  # token embeddings (llama.cpp keeps them on the CPU)
    output_bytes: int  # output head and norm: the "output layer" --gpu-layers counts last
    output_tied: bool  # no output.weight: the head reuses token_embd (copied when offloaded)
    other_bytes: int  # anything else (rope factors, ...), on the CPU

    @property
    def n_offloadable(self) -> int:
        """What llama.cpp counts in "offloaded N/M layers": the repeating layers plus the output."""
        return self.n_layer + 1

    @property
    def weight_bytes(self) -> int:
        return sum(self.layer_bytes) + self.input_bytes + self.output_bytes + self.other_bytes

    @classmethod
    def from_gguf(cls, info: GGUFInfo, extra_tensors: Iterable = ()) -> ModelShape:
        """From a header (plus the tensors of a split model's other shards). Raises ShapeError."""
        arch = info.architecture
        n_layer = info.block_count
        n_embd = info.embedding_length
        if not arch or not n_layer or not n_embd:
            raise ShapeError("the header has no architecture, block_count or embedding_length")
        attention = _attention(info.metadata, arch, n_layer, n_embd)
        weights, embd_shape = _weights(list(info.tensors) + list(extra_tensors), n_layer)
        if info.vocab_size is not None:
            n_vocab = info.vocab_size
        elif len(embd_shape) >= 2:
            n_vocab = embd_shape[1]
        else:
            raise ShapeError("cannot tell the vocabulary size")
        return cls(arch=arch, n_layer=n_layer, n_embd=n_embd, n_vocab=n_vocab, n_ctx_train=info.context_length or 0,
                   **attention, **_sliding_window(info, arch, n_layer), **weights)  # fmt: skip


def _attention(md: dict, arch: str, n_layer: int, n_embd: int) -> dict:
    """ModelShape's heads (the most of any layer, and the KV heads of each) and head sizes."""
    head = _per_layer(md.get(f"{arch}.attention.head_count"), n_layer, "head_count")
    head_kv_raw = md.get(f"{arch}.attention.head_count_kv", md.get(f"{arch}.attention.head_count"))
    head_kv = _per_layer(head_kv_raw, n_layer, "head_count_kv")
    n_head = max(head) or 1
    key_len = md.get(f"{arch}.attention.key_length")
    val_len = md.get(f"{arch}.attention.value_length")
    lora = md.get(f"{arch}.attention.kv_lora_rank")
    if isinstance(lora, int) and lora > 0:  # MLA (deepseek2): the cache holds the compressed latent
        rope = md.get(f"{arch}.rope.dimension_count")
        key_len, val_len = lora + (rope if isinstance(rope, int) else 64), lora
        head_kv = tuple(1 if h else 0 for h in head_kv)
    head_dim_k = key_len if isinstance(key_len, int) and key_len > 0 else n_embd // n_head
    head_dim_v = val_len if isinstance(val_len, int) and val_len > 0 else head_dim_k
    return {"n_head": n_head, "n_head_kv": head_kv, "head_dim_k": head_dim_k, "head_dim_v": head_dim_v}


def _weights(tensors: list, n_layer: int) -> tuple[dict, tuple[int, ...]]:
    """ModelShape's weight bytes by where llama.cpp puts them, and the shape of token_embd.weight."""
    layer = [0] * n_layer
    input_b = output_b = other_b = 0
    has_output = False
    embd_shape: tuple[int, ...] = ()
    for t in tensors:
        m = re.match(r"blk\.(\d+)\.", t.name)
        if m and int(m.group(1)) < n_layer:
            layer[int(m.group(1))] += t.n_bytes
        elif t.name.startswith("token_embd."):
            input_b += t.n_bytes
            if t.name == "token_embd.weight":
                embd_shape = t.shape
        elif t.name.startswith("output"):
            output_b += t.n_bytes
            has_output = has_output or t.name == "output.weight"
        else:
            other_b += t.n_bytes
    placed = {"layer_bytes": tuple(layer), "input_bytes": input_b, "output_bytes": output_b, "other_bytes": other_b}
    return {**placed, "output_tied": not has_output}, embd_shape


def _sliding_window(info: GGUFInfo, arch: str, n_layer: int) -> dict:
    """ModelShape's window (0: none) and which layers use it."""
    n_swa = info.sliding_window or 0
    swa_layers = (False,) * n_layer
    if n_swa > 0:
        pattern = info.metadata.get(f"{arch}.attention.sliding_window_pattern")
        if isinstance(pattern, list) and len(pattern) == n_layer:
            swa_layers = tuple(bool(v) for v in pattern)
        else:
            n = pattern if isinstance(pattern, int) and pattern > 0 else _SWA_PATTERNS.get(arch)
            if n:
                swa_layers = tuple(il % n < n - 1 for il in range(n_layer))
    return {"n_swa": n_swa if any(swa_layers) else 0, "swa_layers": swa_layers}


def type_bytes(cache_type: str, n_elements: int) -> int:
    """Bytes of ``n_elements`` stored as a ggml type (f16, q8_0, ...)."""
    block, size = ggml_type_size(cache_type.upper())
    return -(-n_elements // block) * size


@dataclass(frozen=True)
class Estimate:
    """Bytes llama.cpp will allocate, split between the host (RAM) and the GPU(s)."""

    n_ctx: int  # cells, as llama.cpp pads them
    n_ubatch: int
    n_gpu_layers: int  # 0 .. n_layer + 1, as llama.cpp will apply it
    weights_cpu: int
    weights_gpu: int
    kv_cpu: int
    kv_gpu: int
    compute_cpu: int
    compute_gpu: int
    output: int  # logits buffer, on the host

    @property
    def weights(self) -> int:
        return self.weights_cpu + self.weights_gpu

    @property
    def kv(self) -> int:
        return self.kv_cpu + self.kv_gpu

    @property
    def compute(self) -> int:
        return self.compute_cpu + self.compute_gpu

    @property
    def cpu_bytes(self) -> int:
        return self.weights_cpu + self.kv_cpu + self.compute_cpu + self.output

    @property
    def gpu_bytes(self) -> int:
        return self.weights_gpu + self.kv_gpu + self.compute_gpu

    @property
    def total(self) -> int:
        return self.cpu_bytes + self.gpu_bytes

    def to_json(self) -> dict[str, int]:
        return {
            "n_ctx": self.n_ctx,
            "n_gpu_layers": self.n_gpu_layers,
            "weights_bytes": self.weights,
            "kv_cache_bytes": self.kv,
            "compute_bytes": self.compute,
            "output_bytes": self.output,
            "cpu_bytes": self.cpu_bytes,
            "gpu_bytes": self.gpu_bytes,
            "total_bytes": self.total,
        }


def effective_batch(n_ctx: int, n_batch: int, n_ubatch: int, n_seq_max: int = 1) -> tuple[int, int]:
    """(n_batch, n_ubatch) as the engine and llama.cpp will set them."""
    nb = min(n_batch, n_ctx) if n_seq_max == 1 else n_batch
    return nb, max(1, min(n_ubatch, nb))


def estimate(
    shape: ModelShape,
    *,
    n_ctx: int,
    n_batch: int = 2048,
    n_ubatch: int = 512,
    n_seq_max: int = 1,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    flash_attn: str = "auto",
    n_gpu_layers: int = 0,
    swa_full: bool = True,
) -> Estimate:
    """The buffers llama.cpp allocates for this model and context (see the module docstring)."""
    n_seq = max(1, n_seq_max)
    _, ub = effective_batch(n_ctx, n_batch, n_ubatch, n_seq)
    cells_seq = _pad(max(1, n_ctx // n_seq))  # per sequence (non-unified cache: one stream each)
    cells = cells_seq * n_seq
    swa_cells_seq = cells_seq if swa_full else min(cells_seq, _pad(shape.n_swa + ub))
    swa_cells = swa_cells_seq * n_seq

    k = shape.n_offloadable if n_gpu_layers < 0 else min(n_gpu_layers, shape.n_offloadable)
    return Estimate(n_ctx=cells, n_ubatch=ub, n_gpu_layers=k, output=shape.n_vocab * 4 * n_seq,
                    **_placed(shape, k, cells, swa_cells, cache_type_k, cache_type_v),
                    **_compute(shape, k, ub, cells_seq, swa_cells_seq, flash_attn))  # fmt: skip


def _placed(shape: ModelShape, k: int, cells: int, swa_cells: int, cache_type_k: str, cache_type_v: str) -> dict:
    """Estimate's weights and KV cache, host and GPU, with the last ``k`` layers offloaded."""
    n_layer = shape.n_layer
    first_gpu = n_layer - min(k, n_layer)  # llama.cpp offloads the last layers first
    weights_cpu = shape.input_bytes + shape.other_bytes
    weights_gpu = 0
    kv_cpu = kv_gpu = 0
    for il in range(n_layer):
        c = swa_cells if shape.swa_layers[il] else cells
        kv = type_bytes(cache_type_k, c * shape.n_head_kv[il] * shape.head_dim_k)
        kv += type_bytes(cache_type_v, c * shape.n_head_kv[il] * shape.head_dim_v)
        if il >= first_gpu:
            weights_gpu += shape.layer_bytes[il]
            kv_gpu += kv
        else:
            weights_cpu += shape.layer_bytes[il]
            kv_cpu += kv
    if k > n_layer:  # the output layer too
        weights_gpu += shape.output_bytes + (shape.input_bytes if shape.output_tied else 0)
    else:
        weights_cpu += shape.output_bytes
    return {"weights_cpu": weights_cpu, "weights_gpu": weights_gpu, "kv_cpu": kv_cpu, "kv_gpu": kv_gpu}


def _compute(shape: ModelShape, k: int, ub: int, cells_seq: int, swa_cells_seq: int, flash_attn: str) -> dict:
    """Estimate's compute buffer: the graph llama.cpp reserves for one ubatch, at its widest point."""
    fa = flash_attn != "off"
    logits_phase = ub * 4 * (shape.n_vocab + 2 * shape.n_embd)
    n_kv = cells_seq
    masks = n_kv + (min(swa_cells_seq, n_kv) if shape.n_swa else 0)
    attn_phase = ub * masks * (2 if fa else 4) + ub * 4 * 12 * shape.n_embd
    if not fa:
        attn_phase += ub * n_kv * shape.n_head * 4  # the KQ matrix of one layer, f32
    if k == 0:
        return {"compute_cpu": max(logits_phase, attn_phase), "compute_gpu": 0}
    if k > shape.n_layer:  # the output layer on the GPU
        return {"compute_cpu": ub * 4 * 2 * shape.n_embd, "compute_gpu": max(logits_phase, attn_phase)}
    return {"compute_cpu": logits_phase, "compute_gpu": attn_phase}


def fit_gpu_layers(shape: ModelShape, vram_free: int, *, headroom: int = DEFAULT_GPU_HEADROOM, **kw) -> int:
    """The most layers (0 .. n_layer + 1) whose GPU buffers fit in ``vram_free - headroom``."""
    budget = vram_free - headroom
    if budget <= 0:
        return 0
    for k in range(shape.n_offloadable, 0, -1):
        if estimate(shape, n_gpu_layers=k, **kw).gpu_bytes <= budget:
            return k
    return 0


def largest_ctx(shape: ModelShape, room: Room, *, upper: int, n_gpu_layers: int, **kw) -> int:
    """The largest context (a multiple of 256, at most ``upper``) that fits ``room``; 0 if none."""

    def fits(n: int) -> bool:
        return room.holds(estimate(shape, n_ctx=n, n_gpu_layers=n_gpu_layers, **kw))

    lo, hi = 0, max(0, upper) // CTX_PAD
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * CTX_PAD):
            lo = mid
        else:
            hi = mid - 1
    return lo * CTX_PAD


@dataclass(frozen=True)
class Room:
    """The memory one load may take: host bytes, and the GPUs' free bytes (None: no figure).
    On unified memory the GPU's buffers come out of the host's bytes too."""

    ram: int
    vram: int | None
    unified: bool = False

    def host_need(self, e: Estimate) -> int:
        return e.cpu_bytes + (e.gpu_bytes if self.unified else 0)

    def holds(self, e: Estimate) -> bool:
        if self.host_need(e) > self.ram:
            return False
        return not (e.gpu_bytes and self.vram is not None and e.gpu_bytes > self.vram)


@dataclass(frozen=True)
class Sizing:
    """The estimate's answer for one load: the context and GPU layers to ask llama.cpp for, what
    they take and whether that fits; when it does not, the figures a refusal advises with."""

    n_ctx: int
    n_gpu_layers: int
    estimate: Estimate
    fits: bool
    reduced: bool = False  # the context was made smaller to fit
    max_gpu_layers: int | None = None  # not fitting: the most layers whose GPU buffers fit in all of room.vram
    max_ctx: int | None = None  # not fitting: the largest context that fits with these layers


def size_load(
    shape: ModelShape, room: Room, *, n_ctx: int, n_gpu_layers: int, shrink_to: int | None = None,
    auto_headroom: int = 0, **kw,
) -> Sizing:  # fmt: skip
    """Everything the pre-flight needs to decide one load, asked once.

    ``n_gpu_layers``: a count (0 .. n_layer + 1), or GPU_LAYERS_AUTO for as many as fit in
    ``room.vram`` less ``auto_headroom`` at the context chosen. When ``n_ctx`` does not fit and
    ``shrink_to`` is set, the context becomes the largest that fits with those layers, if that is at
    least ``shrink_to``, and the layers are fitted again to it.
    """

    def layers(ctx: int) -> int:
        if n_gpu_layers != GPU_LAYERS_AUTO:
            return n_gpu_layers
        return fit_gpu_layers(shape, room.vram or 0, headroom=auto_headroom, n_ctx=ctx, **kw)

    k = layers(n_ctx)
    est = estimate(shape, n_ctx=n_ctx, n_gpu_layers=k, **kw)
    reduced = False
    if not room.holds(est) and shrink_to is not None:
        fit = largest_ctx(shape, room, upper=n_ctx, n_gpu_layers=k, **kw)
        if fit >= shrink_to:
            n_ctx, reduced = fit, True
            k = layers(n_ctx)
            est = estimate(shape, n_ctx=n_ctx, n_gpu_layers=k, **kw)
    if room.holds(est):
        return Sizing(n_ctx, k, est, True, reduced)
    return Sizing(
        n_ctx, k, est, False, reduced,
        max_gpu_layers=fit_gpu_layers(shape, room.vram or 0, headroom=0, n_ctx=est.n_ctx, **kw),
        max_ctx=largest_ctx(shape, room, upper=est.n_ctx, n_gpu_layers=k, **kw),
    )  # fmt: skip
