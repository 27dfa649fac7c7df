"""Hyperparameters llama.cpp asserts on, refused before it sees them.

A header can be a well-formed GGUF (:mod:`localinfer.gguf.parser` accepts it) and still carry values
that make llama.cpp hit a ``GGML_ASSERT`` and abort the whole interpreter (SIGABRT) while loading or
running the model: a block count of 0, more experts used than exist, a vocabulary shorter than the
embedding, a negative norm epsilon. Most rules mirror one such assert (in ``load_hparams``, or in a
ggml op the graph reaches); the others refuse inconsistencies (block tensors, head and vocabulary
sizes) that llama.cpp meets later, with a less clear error or worse. A value of the wrong type is left
alone: llama.cpp refuses those itself, with an error it recovers from.
"""

from __future__ import annotations

import math
import os
import re
from typing import TypeGuard

from localinfer.errors import InvalidModelError
from localinfer.gguf.reader import parse_gguf
from localinfer.gguf.types import GGUFInfo

__all__ = ["check_hyperparameters", "read_gguf", "validate_gguf"]

MAX_LAYERS = 512  # LLAMA_MAX_LAYERS
MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS
EPSILON_KEYS = ("layer_norm_epsilon", "layer_norm_rms_epsilon", "group_norm_epsilon")  # attention.*
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # anything else trips an assert

_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.")
_HINT = (
    "llama.cpp would abort on this value; get the model from another source, "
    "or convert it again with current llama.cpp tools"
)


def read_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    """The header of a GGUF file that llama.cpp can load without aborting, without reading tensor data.

    Raises :class:`~localinfer.errors.ModelNotFoundError` if ``path`` does not exist and
    :class:`~localinfer.errors.InvalidModelError` for a malformed file (``"not a valid GGUF file:
    <reason>"``, see :func:`~localinfer.gguf.reader.parse_gguf`) or a hyperparameter llama.cpp
    asserts on (``"<file name> is not a usable model: <reason>"``).
    """
    return check_hyperparameters(parse_gguf(path))


def validate_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    """Same as :func:`read_gguf` (the name reads better at call sites that only care the file is sound)."""
    return read_gguf(path)


def check_hyperparameters(info: GGUFInfo) -> GGUFInfo:
    """``info`` itself, or :class:`InvalidModelError` naming the first key llama.cpp would abort on."""
    arch = info.architecture
    if not arch:
        return info  # no model hyperparameters to check (llama.cpp refuses the file cleanly)
    _check_blocks(info, arch)
    _check_experts(info, arch)
    _check_heads(info, arch)
    _check_vocabulary(info)
    _check_epsilons(info, arch)
    _check_rope_scaling(info, arch)
    return info


def _refuse(info: GGUFInfo, reason: str) -> InvalidModelError:
    return InvalidModelError(f"{info.path.name} is not a usable model: {reason}", hint=_HINT)


def _check_blocks(info: GGUFInfo, arch: str) -> None:
    key = f"{arch}.block_count"
    n = _int(info.metadata.get(key))
    if n is None:
        return
    if not 1 <= n <= MAX_LAYERS:
        raise _refuse(info, f"{key} is {n} (llama.cpp supports 1 to {MAX_LAYERS} blocks)")
    blocks = [int(m.group(1)) for t in info.tensors if (m := _BLOCK_TENSOR.match(t.name))]
    if not blocks:
        return
    top = max(blocks)
    if top >= n:
        raise _refuse(info, f"{key} is {n}, but the file has tensors for block {top} (blk.{top}.*)")
    # the shards of a split model each hold some of the blocks: only a whole file must hold them all
    if (info.split_count or 1) <= 1 and n > top + 1:
        raise _refuse(info, f"{key} is {n}, but the file's tensors stop at block {top} (blk.{top}.*)")


def _check_experts(info: GGUFInfo, arch: str) -> None:
    count_key, used_key = f"{arch}.expert_count", f"{arch}.expert_used_count"
    # both default to 0 in llama.cpp; expert_used_count may be per layer, checked by its largest entry
    count, used = _int(info.metadata.get(count_key, 0)), _ints(info.metadata.get(used_key, 0))
    if count is None or used is None:
        return
    if not 0 <= count <= MAX_EXPERTS:
        raise _refuse(info, f"{count_key} is {count} (llama.cpp supports 0 to {MAX_EXPERTS} experts)")
    if min(used) < 0:
        raise _refuse(info, f"{used_key} is {min(used)} (it must not be negative)")
    if max(used) > count:
        raise _refuse(info, f"{used_key} is {max(used)}, more than {count_key} ({count})")
    if count and not max(used):
        raise _refuse(info, f"{count_key} is {count}, but {used_key} is 0 or missing (must be at least 1)")


def _check_heads(info: GGUFInfo, arch: str) -> None:
    md = info.metadata
    head_key, kv_key = f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv"
    heads = _ints(md.get(head_key))
    kv = _ints(md.get(kv_key, md.get(head_key)))  # head_count_kv defaults to head_count
    if heads is None or kv is None:
        return
    if min(heads) < 0:
        raise _refuse(info, f"{head_key} is {min(heads)} (it must not be negative)")
    # 0 heads is how recurrent models (Mamba, RWKV) say "no attention"; otherwise, unless key_length
    # says the head size, llama.cpp gets it by dividing the embedding among the first layer's heads
    n_embd = _int(md.get(f"{arch}.embedding_length"))
    if n_embd and heads[0] > 0 and f"{arch}.attention.key_length" not in md and n_embd % heads[0]:
        raise _refuse(info, f"{arch}.embedding_length {n_embd} is not divisible by {head_key} ({heads[0]})")
    # a scalar applies to every layer; per-layer arrays are compared layer by layer
    if len(heads) == 1:
        heads = heads * len(kv)
    if len(kv) == 1:
        kv = kv * len(heads)
    for layer, (h, k) in enumerate(zip(heads, kv)):
        where = f"{kv_key}[{layer}]" if len(kv) > 1 else kv_key
        if k < 0:
            raise _refuse(info, f"{where} is {k} (it must not be negative)")
        if k > h or (k and h % k):  # 0 KV heads: a layer without attention
            raise _refuse(info, f"{where} is {k}, which does not divide {head_key} ({h})")


def _check_vocabulary(info: GGUFInfo) -> None:
    n_tokens = info.vocab_size
    emb = next((t for t in info.tensors if t.name == "token_embd.weight"), None)
    if n_tokens is None or emb is None or len(emb.shape) < 2:
        return
    if n_tokens < emb.shape[1]:  # ggml order: shape[1] is the vocabulary, one row per token
        raise _refuse(
            info,
            f"tokenizer.ggml.tokens has {n_tokens} tokens, fewer than the {emb.shape[1]} rows "
            "of token_embd.weight",
        )


def _check_epsilons(info: GGUFInfo, arch: str) -> None:
    for suffix in EPSILON_KEYS:
        key = f"{arch}.attention.{suffix}"
        eps = info.metadata.get(key)
        # ggml asserts eps >= 0 (NaN fails it too); 0 and inf pass it but divide by zero or wipe the output
        if _number(eps) and not (math.isfinite(eps) and eps > 0):
            raise _refuse(info, f"{key} is {eps:g} (it must be a positive, finite number)")


def _check_rope_scaling(info: GGUFInfo, arch: str) -> None:
    key = f"{arch}.rope.scaling.type"
    scaling = info.metadata.get(key)
    if isinstance(scaling, str) and scaling not in ROPE_SCALING_TYPES:
        raise _refuse(info, f"{key} is {scaling!r} (llama.cpp knows {', '.join(ROPE_SCALING_TYPES)})")


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ints(value: object) -> list[int] | None:
    """A scalar or per-layer integer hyperparameter as a list; None when it is anything else
    (absent, summarised, empty, not integers)."""
    if (one := _int(value)) is not None:
        return [one]
    if isinstance(value, list) and value and all(_int(v) is not None for v in value):
        return value
    return None


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
