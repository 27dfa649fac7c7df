"""`localinfer batch` on the real models: the engine's multi-sequence decoding, and the command end to end."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from conftest import run_cli

from localinfer.batch import job as batchjob

from localinfer.generate import loading
from localinfer.batch.io import BatchRequest, InputError
from localinfer.engine.types import LoadOptions
from localinfer.request.sampling import SamplingOptions
from localinfer.store import resolve_model

pytestmark = pytest.mark.slow

GREEDY = SamplingOptions(temperature=0.0)
PROMPTS = [
    "Write a haiku about the sea.",
    "What is the capital of France?",
    "Explain gravity to a child.",
    "List three fruits.",
    "Tell me a joke about computers.",
    "Why is the sky blue?",
]


def _load(path, parallel, ctx=512):
    resolved = resolve_model(str(path))
    return loading.load(resolved, batchjob.batch_load_options(LoadOptions(n_threads=1), parallel=parallel, ctx_per_seq=ctx))


def _records(stdout: bytes) -> list[dict]:
    return [json.loads(line) for line in stdout.decode().splitlines()]


# -- the engine through the core API ---------------------------------------------------------------


def test_greedy_output_is_the_same_whatever_parallel(smollm2_path):
    """Sequences share one context but not their KV cells: every answer is the one --parallel 1 gives.

    SmolLM2 Q4_1 computes each row of a batched matmul exactly as a single row, so equality is exact.
    """
    items = [BatchRequest(id=i, line=i + 1, prompt=p) for i, p in enumerate(PROMPTS)]
    defaults = batchjob.BatchDefaults(sampling=GREEDY, max_tokens=24)
    texts = {}
    for parallel in (1, 4):
        loaded = _load(smollm2_path, parallel)
        stats = batchjob_stats()
        try:
            results = list(batchjob.run_batch(items, loaded, parallel, defaults, stats=stats))
        finally:
            loaded.close()
        assert stats.max_active == parallel
        assert all(r.error is None and r.stats.completion_tokens > 0 for r in results)
        texts[parallel] = {r.id: r.text for r in results}
    assert texts[1] == texts[4]
    assert len(set(texts[1].values())) == len(PROMPTS)  # different prompts, different answers


def batchjob_stats():
    from localinfer.engine.batch import BatchStats

    return BatchStats()


def test_a_sequence_never_sees_its_neighbours(gemma_path):
    """Same batch shapes, different neighbours: the answer does not move by a single token.

    (Across --parallel values Gemma's answers can differ: its Q5_0/Q8_0 matmuls take llamafile's
    tinyBLAS path for 2+ rows and ggml's vec_dot for one, which rounds differently - the same happens
    to one sequence fed token by token instead of all at once. So isolation is tested here with
    the batch shapes held fixed.)
    """
    from localinfer.engine.batch import BatchDecoder, SeqJob

    loaded = _load(gemma_path, 3, ctx=256)
    try:
        target = loaded.model.tokenize("The three primary colors are")
        answers = []
        for trial in range(2):
            rng = random.Random(trial)
            jobs = [SeqJob("target", target, GREEDY, max_tokens=16, ignore_eos=True)] + [
                SeqJob(i, [rng.randrange(1000, 50000) for _ in range(len(target) + i)], GREEDY, max_tokens=16, ignore_eos=True)
                for i in range(2)
            ]
            with BatchDecoder(loaded.model, 3) as decoder:
                results = {r.key: r for r in decoder.run(jobs)}
            assert decoder.stats.max_active == 3
            answers.append((results["target"].text, [results[i].text for i in range(2)]))
    finally:
        loaded.close()
    assert answers[0][0] == answers[1][0]
    assert answers[0][1] != answers[1][1]  # the neighbours did say different things


def test_continuous_batching_refills_slots_and_mixes_prefill_with_decode(smollm2_path):
    from localinfer.engine.batch import BatchDecoder, SeqJob

    loaded = _load(smollm2_path, 2, ctx=256)
    try:
        prompt = loaded.model.tokenize("Once upon a time")
        lengths = [40, 4, 4, 4]
        jobs = [SeqJob(i, prompt, GREEDY, max_tokens=n, ignore_eos=True) for i, n in enumerate(lengths)]
        with BatchDecoder(loaded.model, 2) as decoder:
            results = {r.key: r for r in decoder.run(jobs)}
        stats = decoder.stats
    finally:
        loaded.close()
    assert [results[i].stats.completion_tokens for i in range(4)] == lengths
    assert all(results[i].stats.finish_reason == "length" for i in range(4))
    # The short jobs took slot 2 one after another while job 0 was still generating...
    assert results[3].t_admit < results[0].t_end
    # ...their prompts were evaluated in the same batches as job 0's next tokens (jobs 2 and 3;
    # jobs 0 and 1 started together)...
    assert stats.mixed_steps == 2
    # ...and nothing waited: job 0's 40 tokens took 40 steps, the others fitting alongside.
    assert stats.steps == 40
    assert stats.sampled_tokens == sum(lengths)


def test_idle_sequences_between_busy_ones_get_a_throwaway_token(smollm2_path):
    """Without a unified KV cache llama.cpp runs one ubatch per run of consecutive sequence ids; a
    filler token for each idle id keeps the batch whole, and changes nobody's answer."""
    from localinfer.engine.batch import BatchDecoder, SeqJob

    loaded = _load(smollm2_path, 4, ctx=256)
    try:
        prompt = loaded.model.tokenize("The weather today is")
        texts, fillers = {}, {}
        for fill in (True, False):
            jobs = [SeqJob(i, prompt, GREEDY, max_tokens=12 if i % 2 == 0 else 1, ignore_eos=True) for i in range(4)]
            with BatchDecoder(loaded.model, 4) as decoder:
                decoder.fill_gaps = fill
                texts[fill] = {r.key: r.text for r in decoder.run(jobs)}
            fillers[fill] = decoder.stats.filler_tokens
    finally:
        loaded.close()
    # Jobs 1 and 3 stop after one token; sequence 1 then idles between 0 and 2 for 11 steps.
    assert fillers == {True: 11, False: 0}
    assert texts[True] == texts[False]
    assert len(texts[True][0]) > len(texts[True][1])


def test_presence_and_frequency_penalties_are_in_each_sequences_chain(smollm2_path):
    """OpenAI's penalties (serve's presence_penalty/frequency_penalty) go into llama.cpp's penalties
    sampler over the last repeat_last_n tokens, prompt included (-1: the whole context, which
    llama.cpp's sampler alone would read as off). A huge penalty forces the situation whatever the
    CPU rounds: greedy can then never pick a token it has already seen."""
    from localinfer.engine.batch import BatchDecoder, SeqJob

    loaded = _load(smollm2_path, 2, ctx=256)
    pieces: dict[str, list[str]] = {"presence": [], "frequency": []}
    try:
        prompt = loaded.model.tokenize("one one one one one one one one")
        jobs = [
            SeqJob(key, prompt, SamplingOptions(temperature=0.0, repeat_last_n=-1, **{f"{key}_penalty": 1e4}),
                   max_tokens=16, ignore_eos=True, on_text=pieces[key].append)
            for key in pieces
        ]  # fmt: skip
        with BatchDecoder(loaded.model, 2) as decoder:
            out = {r.key: r for r in decoder.run(jobs)}
    finally:
        loaded.close()
    for key, seen in pieces.items():
        assert out[key].stats.completion_tokens == 16 and "".join(seen) == out[key].text
        # each sampled token a new one (a token's text is its own: SmolLM2's pieces are distinct)
        assert len(set(seen)) == len(seen) > 8, seen
        assert not {"one", " one"} & set(seen), seen


def test_per_request_options_and_errors(smollm2_path):
    items = [
        BatchRequest(id="short", line=1, prompt="Count from one to twenty.", max_tokens=3),
        BatchRequest(id="seed-a", line=2, prompt="Invent a name for a cat.", temperature=1.0, seed=123, max_tokens=12),
        BatchRequest(id="seed-b", line=3, prompt="Invent a name for a cat.", temperature=1.0, seed=123, max_tokens=12),
        InputError(4, "not valid JSON: x"),
        BatchRequest(id="long", line=5, prompt="word " * 600),
        BatchRequest(id="stop", line=6, messages=({"role": "user", "content": "Count from 1 to 10, separated by commas."},), stop=("5",), max_tokens=40),
    ]
    loaded = _load(smollm2_path, 3)
    try:
        results = {r.id: r for r in batchjob.run_batch(items, loaded, 3, batchjob.BatchDefaults(sampling=GREEDY))}
    finally:
        loaded.close()
    assert set(results) == {"short", "seed-a", "seed-b", None, "long", "stop"}
    assert results["short"].stats.completion_tokens == 3 and results["short"].finish_reason == "length"
    assert results["seed-a"].text == results["seed-b"].text  # own sampler chain and seed per sequence
    assert results[None].to_json() == {"id": None, "line": 4, "error": "not valid JSON: x"}
    long = results["long"].to_json()
    assert long["line"] == 5 and "tokens) exceeds the context window (512 tokens)" in long["error"]  # no max_tokens: one subject
    assert results["stop"].finish_reason == "stop" and "5" not in results["stop"].text and "4" in results["stop"].text


# -- the command ----------------------------------------------------------------------------------------


def test_jsonl_in_jsonl_out(smollm2_path, tmp_path):
    reqs = tmp_path / "reqs.jsonl"
    reqs.write_text("\n".join([
        json.dumps({"id": "q1", "prompt": "What is 2+2?", "max_tokens": 8}),
        json.dumps({"id": 7, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}]}),
        "{oops",
        json.dumps({"id": "q3", "prompt": "Say hello."}),
    ]) + "\n")
    proc = run_cli("batch", str(reqs), "-m", str(smollm2_path), "--parallel", "2", "-n", "12", "--temperature", "0", "-c", "512", "-t", "1")
    assert proc.returncode == 0, proc.stderr.decode()
    records = _records(proc.stdout)
    by_id = {r["id"]: r for r in records}
    assert sorted(by_id, key=str) == sorted(["q1", 7, None, "q3"], key=str)
    assert len(records) == 4
    assert by_id[None] == {"id": None, "line": 3, "error": by_id[None]["error"]} and "not valid JSON" in by_id[None]["error"]
    for rid, limit in (("q1", 8), (7, 12), ("q3", 12)):
        r = by_id[rid]
        assert r["text"].strip() and r["finish_reason"] in ("stop", "length")
        assert 0 < r["usage"]["completion_tokens"] <= limit
        assert r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]
        assert r["timings"]["total_ms"] >= r["timings"]["ttft_ms"] > 0
    err = proc.stderr.decode()
    assert "batch: 4 requests · 3 answered · 1 error" in err and "p95" in err
    assert "\x1b[" not in err


def test_text_input_from_stdin_in_input_order(smollm2_path):
    text = "The capital of Italy is\n\nOne plus one equals\nThe color of grass is\n"
    proc = run_cli("batch", "-", "-m", str(smollm2_path), "--parallel", "3", "-n", "6", "--temperature", "0",
                   "-c", "256", "-t", "1", "--keep-order", "--raw", "-q", input=text)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stderr == b""
    records = _records(proc.stdout)
    assert [r["id"] for r in records] == [1, 3, 4]  # ids are line numbers; the blank line is no request
    assert all(r["usage"]["completion_tokens"] > 0 for r in records)


def test_results_come_as_they_finish_or_in_input_order(smollm2_path, tmp_path):
    reqs = tmp_path / "reqs.jsonl"
    reqs.write_text(
        json.dumps({"id": "long", "prompt": "Count from 1 to 100, separated by commas.", "max_tokens": 24}) + "\n"
        + json.dumps({"id": "s1", "prompt": "Hi", "max_tokens": 1}) + "\n"
        + json.dumps({"id": "s2", "prompt": "Hello", "max_tokens": 1}) + "\n"
    )
    args = ("batch", str(reqs), "-m", str(smollm2_path), "--parallel", "3", "--temperature", "0", "-c", "256", "-t", "1", "-q")
    as_done = run_cli(*args)
    in_order = run_cli(*args, "--keep-order")
    assert as_done.returncode == in_order.returncode == 0
    assert [r["id"] for r in _records(as_done.stdout)] == ["s1", "s2", "long"]
    assert [r["id"] for r in _records(in_order.stdout)] == ["long", "s1", "s2"]
    assert _records(in_order.stdout)[0]["usage"]["completion_tokens"] == 24


def test_bad_input_policies_and_overlong_prompts(smollm2_path, tmp_path):
    reqs = tmp_path / "reqs.jsonl"
    reqs.write_text(json.dumps({"id": "ok", "prompt": "Hi", "max_tokens": 2}) + "\n"
                    + json.dumps({"id": "huge", "prompt": "word " * 400}) + "\n")
    args = ("-m", str(smollm2_path), "-n", "4", "-c", "256", "-t", "1", "--parallel", "1")
    proc = run_cli("batch", str(reqs), *args)
    assert proc.returncode == 0
    by_id = {r["id"]: r for r in _records(proc.stdout)}
    assert by_id["huge"]["line"] == 2 and "exceed the context window (256 tokens)" in by_id["huge"]["error"]
    assert by_id["ok"]["usage"]["completion_tokens"] == 2
    proc = run_cli("batch", str(reqs), *args, "--on-error", "abort")
    assert proc.returncode == 6
    assert "line 2 (id 'huge')" in proc.stderr.decode()
    truncated = run_cli("batch", str(reqs), *args, "--on-overflow", "truncate")
    assert truncated.returncode == 0
    huge = {r["id"]: r for r in _records(truncated.stdout)}["huge"]
    assert huge["usage"]["truncated_prompt_tokens"] > 0 and "error" not in huge
    assert huge["usage"]["prompt_tokens"] == 256 - 4  # the end of the prompt, leaving room for -n 4
    assert huge["finish_reason"] in ("stop", "length")
    reqs.write_text('{"id": "ok", "prompt": "Hi"}\n{"id": "bad", "prompt": 3}\n')
    proc = run_cli("batch", str(reqs), *args, "--on-error", "abort")
    assert proc.returncode == 2 and proc.stdout == b""
    assert "line 2: 'prompt' must be a string" in proc.stderr.decode()


def test_model_without_template(gemma_path, tmp_path):
    reqs = tmp_path / "reqs.jsonl"
    reqs.write_text('{"id": 1, "prompt": "The sky is"}\n{"id": 2, "messages": [{"role": "user", "content": "Hi"}]}\n')
    proc = run_cli("batch", str(reqs), "-m", str(gemma_path), "-n", "4", "-c", "256", "-t", "1", "--parallel", "2")
    assert proc.returncode == 0, proc.stderr.decode()
    by_id = {r["id"]: r for r in _records(proc.stdout)}
    assert by_id[1]["usage"]["completion_tokens"] == 4
    assert "no chat template" in by_id[2]["error"]
    assert "running prompts as plain completion" in proc.stderr.decode()


def test_resume_after_sigkill_gives_every_id_exactly_once(smollm2_path, tmp_path):
    reqs = tmp_path / "prompts.txt"
    reqs.write_text("".join(f"Write a short sentence about the number {i}.\n" for i in range(1, 13)))
    out = tmp_path / "out.jsonl"
    args = ["batch", str(reqs), "-o", str(out), "-m", str(smollm2_path), "--parallel", "2", "-n", "24",
            "--temperature", "0", "-c", "256", "-t", "1", "-q"]
    proc = subprocess.Popen([sys.executable, "-m", "localinfer", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the job finished before it could be killed: " + proc.stderr.read().decode()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = out.read_bytes()
    kept = before[: before.rfind(b"\n") + 1]
    written = _records(kept)
    assert 3 <= len(written) < 12
    with open(out, "ab") as fh:  # and as if the kill had torn the line being written
        fh.write(b'{"id": 12, "text": "half a li')

    resumed = run_cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr.decode()
    final = _records(out.read_bytes())
    assert sorted(r["id"] for r in final) == list(range(1, 13))
    assert final[: len(written)] == written  # what was done was kept, not redone
    assert all(r["usage"]["completion_tokens"] > 0 for r in final)

    again = run_cli(*args, "--resume")  # nothing left to do
    assert again.returncode == 0 and _records(out.read_bytes()) == final


def test_parallel_cli_matches_serial_cli(smollm2_path, tmp_path):
    reqs = tmp_path / "reqs.txt"
    reqs.write_text("\n".join(PROMPTS[:4]) + "\n")
    outs = {}
    for parallel in ("1", "4"):
        proc = run_cli("batch", str(reqs), "-m", str(smollm2_path), "--parallel", parallel, "-n", "16",
                       "--temperature", "0", "-c", "256", "-t", "1")
        assert proc.returncode == 0, proc.stderr.decode()
        assert f"at parallel {parallel}" in proc.stderr.decode()
        outs[parallel] = {r["id"]: r["text"] for r in _records(proc.stdout)}
    assert outs["1"] == outs["4"] and len(outs["1"]) == 4


@pytest.mark.skipif(os.name != "posix", reason="SIGINT semantics")
def test_ctrl_c_keeps_what_was_written(smollm2_path, tmp_path):
    reqs = tmp_path / "prompts.txt"
    reqs.write_text("".join(f"Tell me about the number {i}.\n" for i in range(1, 9)))
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "localinfer", "batch", str(reqs), "-o", str(out), "-m", str(smollm2_path),
                             "--parallel", "2", "-n", "40", "-c", "256", "-t", "1"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None and not (out.exists() and out.read_bytes().count(b"\n") >= 1):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert "interrupted" in err.decode() and "Traceback" not in err.decode()
    assert all("text" in r for r in _records(out.read_bytes()))
