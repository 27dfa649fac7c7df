"""The head start of `run`: the weights load while Typer parses, and are used only when they match."""

from __future__ import annotations

import re

import pytest
from conftest import run_cli

from localinfer.cli.prescan import FLAGS, NO_HEAD_START, VALUE_OPTIONS, run_model


def test_prescan_tables_match_runs_options():
    # Every option `run --help` lists must be known to the prescan, with the right arity: an option
    # taking a value that the prescan thought a flag would make it read the value as a prompt word.
    proc = run_cli("run", "--help", env={"COLUMNS": "200"})
    assert proc.returncode == 0
    seen_value, seen_flag = set(), set()
    for line in proc.stdout.decode().splitlines():
        # "  -c, --ctx-size INTEGER RANGE   help": one space before a metavar, two before the help
        m = re.match(r"^\s{2}(-[-\w]+(?:, -[-\w]+)*)( [^ ]+(?: RANGE)?)?(?:\s{2,}|$)", line)
        if not m:
            continue
        names = [n.strip() for n in m.group(1).split(",")]
        (seen_value if m.group(2) else seen_flag).update(names)
    assert "--model" in seen_value and "--raw" in seen_flag  # the help format is what we parse
    assert seen_value == VALUE_OPTIONS
    assert seen_flag == FLAGS | (NO_HEAD_START - {"--"})


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], (True, None)),
        (["hello", "world"], (True, None)),
        (["-p", "-m is text here", "-m", "qwen2.5:0.5b"], (True, "qwen2.5:0.5b")),
        (["--model=./a.gguf", "--raw", "-n", "5"], (True, "./a.gguf")),
        (["-m", "a", "--model", "b"], (True, "b")),  # the last one wins, as in Typer
        (["-p", "x", "--verbose"], (False, None)),
        (["-m", "a", "--help"], (False, None)),
        (["-m", "a", "--unknown"], (False, None)),
        (["-m"], (False, None)),
        (["--", "-m", "a"], (False, None)),
    ],
)
def test_prescan_finds_the_model(args, expected):
    assert run_model(args) == expected


def test_the_weights_loaded_ahead_are_taken_with_their_log(smollm2_path):
    from localinfer.engine import llama as engine
    from localinfer.engine.types import LoadOptions

    assert engine.preload_model(smollm2_path)
    assert not engine.preload_model(smollm2_path)  # one head start per process
    model = engine.Model(smollm2_path, LoadOptions(n_ctx=256, n_threads=2))
    try:
        assert not engine._preloaded
        # llama.cpp logged the weights' buffer from the loading thread; it is part of this load's report
        assert any("model buffer size" in line for line in model.memory_log)
        assert any("KV buffer size" in line for line in model.memory_log)
        assert model.tokenize("Paris") and model.load_s > 0
    finally:
        model.close()


def test_weights_loaded_ahead_with_other_parameters_are_freed(smollm2_path):
    from localinfer.engine import llama as engine
    from localinfer.engine.types import LoadOptions

    assert engine.preload_model(smollm2_path)
    pre = engine._preloaded[0]
    model = engine.Model(smollm2_path, LoadOptions(n_ctx=256, n_threads=2, use_mmap=False))
    try:
        assert pre.model is None and not engine._preloaded  # taken out and freed, then loaded anew
        assert model.tokenize("Paris")
    finally:
        model.close()


def test_run_with_a_head_start_answers_like_without(smollm2_path):
    from typer.testing import CliRunner

    from localinfer.cli.main import build_app

    args = ["run", "-m", str(smollm2_path), "-p", "The capital of France is", "--raw", "-n", "12",
            "--temperature", "0", "-c", "256", "-t", "2", "-q", "--no-log"]  # fmt: skip
    ahead = run_cli(*args)  # the real entry point: prescan + head start
    assert ahead.returncode == 0, ahead.stderr.decode()
    in_process = CliRunner().invoke(build_app(), args)  # no entry point, no head start
    assert in_process.exit_code == 0, in_process.output
    assert ahead.stdout.decode() == in_process.stdout and ahead.stdout.strip()


def test_a_usage_error_while_the_weights_load_exits_cleanly(smollm2_path):
    proc = run_cli("run", "-m", str(smollm2_path), "-p", "hi", "--top-k", "many")
    assert proc.returncode == 2
    assert b"--top-k" in proc.stderr and b"Traceback" not in proc.stderr
    assert proc.stdout == b""
