"""The hyperparameter checks: well-formed GGUFs whose values would make llama.cpp abort the interpreter
(SIGABRT) are refused by validate_gguf (and read_gguf, which the store and the loader call) with one
line naming the key and value; real models and legitimate variations still pass."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli
from ggufsynth import write_gguf, write_tiny_llama

from localinfer.errors import ExitCode, InvalidModelError, exit_code_for
from localinfer.gguf import parse_gguf, read_gguf, validate_gguf

GLOBAL = ("general.", "tokenizer.", "split.")  # keys not under the architecture

# A small, consistent llama-style model: 2 blocks, 16 tokens, 4 query heads sharing 2 KV heads.
GOOD_KEYS: dict[str, object] = {
    "llama.embedding_length": 8,
    "llama.attention.head_count": 4,
    "llama.attention.head_count_kv": 2,
    "llama.attention.layer_norm_rms_epsilon": 1e-5,
    "tokenizer.ggml.tokens": [f"t{i}" for i in range(16)],
}
GOOD_TENSORS = {
    "token_embd.weight": (8, 16),  # ggml order: (embedding, vocabulary)
    "blk.0.attn_norm.weight": (8,),
    "blk.1.attn_norm.weight": (8,),
}


def model(tmp_path: Path, name: str = "m.gguf", *, tensors: dict | None = None, **keys: object) -> Path:
    """The good model with ``keys`` (``llama.`` prefixed, but for tokenizer.* and split.*; None drops one)."""
    extra = {**GOOD_KEYS, **{k if k.startswith(GLOBAL) else f"llama.{k}": v for k, v in keys.items()}}
    block_count = extra.pop("llama.block_count", 2)
    extra = {k: v for k, v in extra.items() if v is not None}
    return write_gguf(tmp_path / name, block_count=block_count, extra=extra, tensors=tensors or GOOD_TENSORS)


def test_the_good_model_passes(tmp_path: Path) -> None:
    info = validate_gguf(model(tmp_path))
    assert info.block_count == 2 and info.vocab_size == 16
    assert read_gguf(info.path) == info


BAD = {
    "block count 0": ({"block_count": 0}, "llama.block_count is 0 (llama.cpp supports 1 to 512 blocks)"),
    "block count 100000": ({"block_count": 100_000}, "llama.block_count is 100000"),
    "negative block count": ({"block_count": -1}, "llama.block_count is -1"),
    "tensors past block_count": (
        {"block_count": 1},
        "llama.block_count is 1, but the file has tensors for block 1 (blk.1.*)",
    ),
    "blocks without tensors": (
        {"block_count": 5},
        "llama.block_count is 5, but the file's tensors stop at block 1 (blk.1.*)",
    ),
    "more experts used than exist": (
        {"expert_count": 4, "expert_used_count": 8},
        "llama.expert_used_count is 8, more than llama.expert_count (4)",
    ),
    "experts used without experts": (
        {"expert_used_count": 2},
        "llama.expert_used_count is 2, more than llama.expert_count (0)",
    ),
    "per-layer experts used": (
        {"expert_count": 8, "expert_used_count": [2, 9]},
        "llama.expert_used_count is 9, more than llama.expert_count (8)",
    ),
    "experts but none used": (
        {"expert_count": 8},
        "llama.expert_count is 8, but llama.expert_used_count is 0 or missing",
    ),
    "negative expert count": ({"expert_count": -2}, "llama.expert_count is -2"),
    "too many experts": ({"expert_count": 5000, "expert_used_count": 2}, "llama.expert_count is 5000"),
    "too few tokens": (
        {"tokenizer.ggml.tokens": ["a", "b", "c", "d"]},
        "tokenizer.ggml.tokens has 4 tokens, fewer than the 16 rows of token_embd.weight",
    ),
    "negative rms epsilon": (
        {"attention.layer_norm_rms_epsilon": -1e-5},
        "llama.attention.layer_norm_rms_epsilon is -1e-05 (it must be a positive, finite number)",
    ),
    "zero rms epsilon": ({"attention.layer_norm_rms_epsilon": 0.0}, "layer_norm_rms_epsilon is 0 "),
    "NaN rms epsilon": ({"attention.layer_norm_rms_epsilon": float("nan")}, "layer_norm_rms_epsilon is nan"),
    "infinite epsilon": ({"attention.layer_norm_epsilon": float("inf")}, "layer_norm_epsilon is inf"),
    "negative epsilon": ({"attention.layer_norm_epsilon": -1.0}, "llama.attention.layer_norm_epsilon is -1 "),
    "negative head count": ({"attention.head_count": -4}, "llama.attention.head_count is -4"),
    "embedding not divisible by heads": (
        {"embedding_length": 10},
        "llama.embedding_length 10 is not divisible by llama.attention.head_count (4)",
    ),
    "more KV heads than heads": (
        {"attention.head_count_kv": 8},
        "llama.attention.head_count_kv is 8, which does not divide llama.attention.head_count (4)",
    ),
    "KV heads not dividing heads": (
        {"attention.head_count_kv": 3},
        "llama.attention.head_count_kv is 3, which does not divide llama.attention.head_count (4)",
    ),
    "per-layer KV heads": (
        {"attention.head_count_kv": [2, 3]},
        "llama.attention.head_count_kv[1] is 3, which does not divide llama.attention.head_count (4)",
    ),
    "unknown rope scaling": ({"rope.scaling.type": "bogus"}, "llama.rope.scaling.type is 'bogus'"),
}


@pytest.mark.parametrize(("keys", "expected"), BAD.values(), ids=BAD.keys())
def test_values_llama_cpp_aborts_on_are_refused(tmp_path: Path, keys: dict, expected: str) -> None:
    path = model(tmp_path, "bad.gguf", **keys)
    parse_gguf(path)  # a well-formed GGUF: only the checks can catch it
    with pytest.raises(InvalidModelError) as exc_info:
        validate_gguf(path)
    exc = exc_info.value
    msg = str(exc)
    assert msg.startswith("bad.gguf is not a usable model: "), msg
    assert expected in msg
    assert "\n" not in msg and exc.hint and "llama.cpp would abort" in exc.hint
    assert exit_code_for(exc) == ExitCode.BAD_MODEL == 4
    with pytest.raises(InvalidModelError, match="is not a usable model"):
        read_gguf(path)  # what the store calls before installing and before loading


GOOD = {
    "explicit head size": ({"embedding_length": 10, "attention.key_length": 2}, None),
    "no attention (recurrent)": ({"attention.head_count": 0, "attention.head_count_kv": None}, None),
    "a layer without attention": ({"attention.head_count_kv": [2, 0]}, None),
    "per-layer heads": ({"attention.head_count": [4, 2], "attention.head_count_kv": [2, 1]}, None),
    "mixture of experts": ({"expert_count": 8, "expert_used_count": 2}, None),
    "more tokens than rows (padding)": ({"tokenizer.ggml.tokens": [f"t{i}" for i in range(20)]}, None),
    "known rope scaling": ({"rope.scaling.type": "yarn"}, None),
    "no block tensors": ({}, {"token_embd.weight": (8, 16)}),
    "first shard of a split model": ({"split.no": 0, "split.count": 2, "block_count": 4}, None),
    "wrong types are llama.cpp's to refuse": ({"block_count": "zero", "expert_count": "x"}, None),
}


@pytest.mark.parametrize(("keys", "tensors"), GOOD.values(), ids=GOOD.keys())
def test_legitimate_variations_pass(tmp_path: Path, keys: dict, tensors: dict | None) -> None:
    validate_gguf(model(tmp_path, tensors=tensors, **keys))


def test_files_without_an_architecture_are_not_checked(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "vocab.gguf", extra={"general.architecture": ""}, block_count=0)
    assert validate_gguf(path).architecture == ""


@pytest.mark.slow
def test_real_models_pass(smollm2_path: Path, gemma_path: Path) -> None:
    for path in (smollm2_path, gemma_path):
        info = validate_gguf(path)
        assert info.block_count and info.vocab_size


@pytest.mark.slow
def test_the_shards_of_a_split_real_model_pass(smollm2_path: Path, tmp_path: Path) -> None:
    from ggufsplit import split_gguf

    first, second = split_gguf(smollm2_path, tmp_path, "smol", n_split=2)
    assert validate_gguf(first).block_count == 30  # holds only some of the 30 blocks
    validate_gguf(second)


# End to end, on a model llama.cpp really runs: with block_count 0 or a negative epsilon it aborted the
# interpreter (exit 134, a backtrace on stdout); with too few tokens it failed to load.
E2E = {
    "blocks": ({"llama.block_count": 0}, 260, "llama.block_count is 0"),
    "tokens": ({}, 200, "tokenizer.ggml.tokens has 200 tokens, fewer than the 260 rows of token_embd.weight"),
    "epsilon": ({"llama.attention.layer_norm_rms_epsilon": -1e-5}, 260, "layer_norm_rms_epsilon is -1e-05"),
}


def test_the_tiny_llama_passes(tmp_path: Path) -> None:
    assert validate_gguf(write_tiny_llama(tmp_path / "tiny.gguf")).vocab_size == 260


@pytest.mark.slow
@pytest.mark.llama
def test_the_tiny_llama_runs(tmp_path: Path) -> None:
    """So that the refusals below are of files llama.cpp would otherwise load."""
    proc = run_cli("run", "-m", str(write_tiny_llama(tmp_path / "tiny.gguf")), "-p", "hi", "-n", "1", timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()


@pytest.mark.slow
@pytest.mark.parametrize(("keys", "n_tokens", "expected"), E2E.values(), ids=E2E.keys())
@pytest.mark.llama
def test_the_cli_refuses_before_llama_cpp_sees_the_file(tmp_path: Path, keys: dict, n_tokens: int, expected: str) -> None:
    path = write_tiny_llama(tmp_path / "bad.gguf", n_tokens=n_tokens, extra=keys)
    proc = run_cli("run", "-m", str(path), "-p", "hi", "-n", "1", timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 4, err  # not 134 (SIGABRT)
    assert proc.stdout == b""
    error, hint = err.splitlines()  # one error line, and its hint
    assert error.startswith("Error: bad.gguf is not a usable model: ") and expected in error, err
    assert hint.startswith("  hint: llama.cpp would abort"), err
