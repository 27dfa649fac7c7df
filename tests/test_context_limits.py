"""Context sizes as a user gives them: beyond the trained size, rounded up by llama.cpp, and an
answer that cannot fit any prompt."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli


def test_a_context_beyond_the_trained_size_is_refused_before_loading(smollm2_path):
    proc = run_cli("run", "-m", str(smollm2_path), "-c", "1000000", "-p", "hi", "-n", "1")
    err = proc.stderr.decode()
    assert proc.returncode == 2 and proc.stdout == b""
    assert "--ctx-size 1000000 is beyond the 8192 tokens" in err and "--force" in err
    assert len(err.strip().splitlines()) == 2  # the error and its hint


def test_the_pre_flight_keeps_a_margin_of_free_memory(monkeypatch):
    from localinfer.system.hardware import MemoryBudget
    from localinfer.system.preflight import _room, ram_margin

    budget = MemoryBudget(ram_available=24 << 30, ram_total=24 << 30)

    class Need:
        def __init__(self, cpu: int) -> None:
            self.cpu_bytes, self.gpu_bytes = cpu, 0

    assert ram_margin(budget) == 1 << 30
    room = _room(budget)
    assert room.holds(Need((23 << 30) - 1)) and not room.holds(Need((23 << 30) + (1 << 20)))


@pytest.mark.slow
def test_a_context_rounded_up_by_llama_cpp_is_reported(smollm2_path):
    proc = run_cli("run", "-m", str(smollm2_path), "-c", "32", "-n", "2", "--json", "-p", "hi")
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout)["context"]["n_ctx"] == 256
    assert "the context is 256 tokens: llama.cpp rounded 32 up" in proc.stderr.decode()
    long = run_cli("run", "-m", str(smollm2_path), "-c", "32", "-n", "16", "-p", "word " * 400)
    assert long.returncode == 6 and "context window (256 tokens; llama.cpp rounded --ctx-size 32 up)" in long.stderr.decode()


@pytest.mark.slow
def test_max_tokens_beyond_the_context_names_max_tokens_not_an_empty_prompt(smollm2_path):
    proc = run_cli("run", "-m", str(smollm2_path), "-c", "256", "-n", "999999999", "-p", "hi")
    err = proc.stderr.decode()
    assert proc.returncode == 6 and "--max-tokens (999999999) leaves no room for a prompt" in err
    assert "prompt (0 tokens)" not in err


@pytest.mark.slow
def test_a_base_model_without_max_tokens_stops_at_the_plain_completion_default(gemma_path):
    # The old README's Gemma example ran 4,091 tokens for 88 s: a base model never chooses to stop.
    proc = run_cli("run", "-m", str(gemma_path), "--raw", "--ignore-eos", "--json", "-p", "The capital of France is")
    assert proc.returncode == 0, proc.stderr.decode()
    data = json.loads(proc.stdout)
    assert data["usage"]["completion_tokens"] == 256 and data["finish_reason"] == "length"
    assert "default limit of 256 tokens" in proc.stderr.decode()


def test_more_threads_than_cpus_is_a_note(smollm2_path):
    import os

    from localinfer.engine.types import LoadOptions
    from localinfer.gguf import read_gguf
    from localinfer.system.hardware import MemoryBudget
    from localinfer.system.preflight import plan_load

    big = MemoryBudget(ram_available=64 << 30, ram_total=64 << 30)
    info = read_gguf(smollm2_path)
    plan = plan_load(info, LoadOptions(n_threads=(os.cpu_count() or 1) * 32), budget=big)
    assert any("more than this machine's" in n for n in plan.notes)
    assert not any("threads" in n for n in plan_load(info, LoadOptions(n_threads=1), budget=big).notes)


def test_the_overflow_message_agrees_with_its_subject_and_names_the_trained_context():
    from localinfer.generate.prepare import overflow_error

    alone = overflow_error(53542, None, 4096, 8192)
    assert str(alone) == "the prompt (53542 tokens) exceeds the context window (4096 tokens)"
    both = overflow_error(3000, 2000, 4096, 8192)
    assert str(both) == "the prompt (3000 tokens) + --max-tokens (2000) exceed the context window (4096 tokens)"
    assert "raise --ctx-size (this model was trained on 8192)" in both.hint
    # Beyond what the model was trained on, a larger --ctx-size is no advice; the trained size is still said.
    assert alone.hint == ("this model was trained on 8192 tokens, fewer than that needs: shorten the prompt, "
                          "or pass --on-overflow truncate to keep the end of the prompt")  # fmt: skip
