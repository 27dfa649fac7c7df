"""`localinfer bench`: llama-bench's method through our engine - tests, statistics, formats, history, cost."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import statistics

import pytest

from conftest import run_cli
from localinfer.bench import method as bench
from localinfer.usage import history
from localinfer.cli.bench import _ints
from localinfer.engine.types import GenerationStats, LoadOptions
from localinfer.request.sampling import SamplingOptions
from localinfer.errors import UsageError

ANSI = re.compile(rb"\x1b\[")
FAST = ["-t", "1", "-r", "2"]


# -- pure logic --------------------------------------------------------------------------------------


def test_tests_are_named_and_ordered_as_llama_bench():
    tests = bench.expand_tests([16, 32], [8], [(4, 2)], [0, 64])
    assert [t.name for t in tests] == [
        "pp16", "pp32", "tg8", "pp4+tg2", "pp16 @ d64", "pp32 @ d64", "tg8 @ d64", "pp4+tg2 @ d64",
    ]
    assert [t.kind for t in tests[:4]] == ["pp", "pp", "tg", "pp+tg"]


def test_zero_sizes_drop_tests_and_nothing_left_is_an_error():
    assert [t.name for t in bench.expand_tests([0], [8], [], [0])] == ["tg8"]
    with pytest.raises(UsageError):
        bench.expand_tests([0], [0], [], [0])


def test_context_is_sized_to_the_largest_test():
    tests = bench.expand_tests([64], [32], [], [100])
    # tg at depth 100: 100 cached + 1 prompt token + 32 decodes.
    assert bench.BenchTest(n_gen=32, depth=100).ctx_needed == 133
    assert bench.context_for(tests, None) == 164  # pp64 @ d100
    assert bench.context_for(tests, 4096) == 4096
    with pytest.raises(UsageError, match="too small"):
        bench.context_for(tests, 128)


def test_mean_and_sample_standard_deviation():
    mean, sd = bench.mean_sd([10.0, 12.0, 14.0])
    assert mean == 12.0 and sd == pytest.approx(2.0)  # n - 1 in the denominator, as llama-bench
    assert bench.mean_sd([5.0]) == (5.0, 0.0)


def test_rep_rates():
    rep = bench.Rep(seconds=0.5, tokens=64, raw_seconds=0.4)
    assert rep.tps == 128.0 and rep.raw_tps == 160.0


def test_list_options_take_commas_repeats_and_ranges():
    assert _ints("-t", ["1,2", "4"], ()) == (1, 2, 4)
    assert _ints("-p", ["16-64*2"], ()) == (16, 32, 64)
    assert _ints("-t", ["1-3"], ()) == (1, 2, 3)
    assert _ints("-t", None, (None,)) == (None,)
    with pytest.raises(UsageError):
        _ints("-t", ["two"], ())
    with pytest.raises(UsageError):
        _ints("-t", ["0"], (), minimum=1)


# -- the engine path: end of generation disabled -----------------------------------------------------


@pytest.mark.slow
def test_every_repetition_generates_exactly_n_tokens_even_past_eos(smollm2_path):
    from localinfer.engine.model import LlamaModel

    with LlamaModel(smollm2_path, LoadOptions(n_ctx=512, n_threads=1)) as model:
        prompt = model.tokenize(
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
            add_special=True, parse_special=True,
        )
        greedy = SamplingOptions(temperature=0.0)
        # Left alone, the model ends its answer early with its end-of-generation token ...
        normal = GenerationStats()
        for _ in model.generate(prompt, greedy, normal, max_tokens=40):
            pass
        assert normal.finish_reason == "stop" and normal.completion_tokens < 40
        # ... bench's path goes on to the end.
        model.reset()
        stats = bench.generate_exactly(model, prompt, 41, greedy)
        assert stats.completion_tokens == 41 and stats.finish_reason == "length"

        reps = bench.run_test(model, bench.BenchTest(n_gen=24), 3, seed=1)
        assert len(reps) == 3 and [r.tokens for r in reps] == [24, 24, 24]
        for r in reps:
            assert 0 < r.raw_seconds <= r.seconds  # llama_decode time is part of the decode time


# -- the command ---------------------------------------------------------------------------------------


def _bench_json(*args, **kw):
    proc = run_cli("bench", *args, "-o", "json", **kw)
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout), proc


SCHEMA = {
    "model", "model_path", "model_sha256", "model_type", "quant", "model_size", "model_n_params", "backend",
    "n_gpu_layers", "n_threads", "n_ctx", "n_batch", "n_ubatch", "test", "kind", "n_prompt", "n_gen", "n_depth",
    "reps", "avg_ts", "stddev_ts", "raw_avg_ts", "raw_stddev_ts", "overhead", "samples_ts", "samples_raw_ts",
    "samples_ns", "samples_tokens", "sampling", "flash_attn", "type_k", "type_v", "llama_cpp_python", "test_time",
}


@pytest.mark.slow
def test_bench_json_schema_and_statistics(smollm2_path, isolated_home):
    rows, proc = _bench_json("-m", str(smollm2_path), "-p", "16", "-n", "8", *FAST)
    assert proc.stderr == b""  # no progress lines when stderr is not a terminal
    assert [r["test"] for r in rows] == ["pp16", "tg8"]
    for r in rows:
        assert SCHEMA <= set(r), SCHEMA - set(r)
        assert r["reps"] == 2 and len(r["samples_ts"]) == 2 and len(r["samples_ns"]) == 2
        assert r["n_threads"] == 1 and r["backend"] == "CPU" and r["quant"] == "Q4_1"
        assert r["model_n_params"] > 100_000_000 and r["model_size"] > 50_000_000
        # Each sample is tokens / time; the figure is their mean and sample standard deviation.
        for ts, ns, tok in zip(r["samples_ts"], r["samples_ns"], r["samples_tokens"]):
            assert ts == pytest.approx(tok / (ns / 1e9), rel=1e-3)
        assert r["avg_ts"] == pytest.approx(statistics.fmean(r["samples_ts"]), rel=1e-3)
        assert r["stddev_ts"] == pytest.approx(statistics.stdev(r["samples_ts"]), rel=1e-3, abs=1e-3)
        assert r["avg_ts"] > 0 and math.isfinite(r["avg_ts"])
    pp, tg = rows
    assert pp["samples_tokens"] == [16, 16] and (pp["n_prompt"], pp["n_gen"]) == (16, 0)
    assert tg["samples_tokens"] == [8, 8] and (tg["n_prompt"], tg["n_gen"]) == (0, 8)
    # Raw = time inside llama_decode only: never slower than the whole path.
    assert tg["raw_avg_ts"] >= tg["avg_ts"] and 0 <= tg["overhead"] < 1


@pytest.mark.slow
def test_bench_repetitions_depth_and_pp_tg(smollm2_path, isolated_home):
    rows, _ = _bench_json("-m", str(smollm2_path), "-p", "8", "-n", "4", "--pg", "8,4", "-d", "16", "-r", "3", "-t", "1")
    assert [r["test"] for r in rows] == ["pp8 @ d16", "tg4 @ d16", "pp8+tg4 @ d16"]
    assert all(r["reps"] == 3 and len(r["samples_ts"]) == 3 and r["n_depth"] == 16 for r in rows)
    assert rows[2]["samples_tokens"] == [12, 12, 12]  # pp+tg counts the prompt and the generated tokens
    assert all(r["n_ctx"] >= 16 + 8 + 4 for r in rows)


@pytest.mark.slow
def test_two_models_side_by_side_in_one_table(smollm2_path, gemma_path, isolated_home):
    proc = run_cli("bench", "-m", f"{smollm2_path},{gemma_path}", "-p", "8", "-n", "4", "-r", "1", "-t", "1", "-o", "md")
    assert proc.returncode == 0, proc.stderr.decode()
    lines = proc.stdout.decode().splitlines()
    assert lines[0].startswith("| model") and "t/s" in lines[0] and "threads" in lines[0] and "quant" in lines[0]
    body = lines[2:]
    assert len(body) == 4
    assert sum(str(smollm2_path) in ln for ln in body) == 2 and sum(str(gemma_path) in ln for ln in body) == 2
    assert any("Q4_K_M" in ln for ln in body) and any("Q4_1" in ln for ln in body)
    assert all(re.search(r"\d+\.\d\d ± \d+\.\d\d", ln) for ln in body)


@pytest.mark.slow
def test_default_table_csv_and_jsonl(smollm2_path, isolated_home):
    base = ("bench", "-m", str(smollm2_path), "-p", "8", "-n", "4", "-r", "1", "-t", "1")
    table = run_cli(*base)
    assert table.returncode == 0 and not ANSI.search(table.stdout)
    text = table.stdout.decode()
    assert "t/s" in text and "pp8" in text and "tg4" in text and "raw t/s" in text
    rows = list(csv.DictReader(io.StringIO(run_cli(*base, "-o", "csv").stdout.decode())))
    assert [r["test"] for r in rows] == ["pp8", "tg4"] and float(rows[0]["avg_ts"]) > 0
    lines = run_cli(*base, "-o", "jsonl").stdout.decode().splitlines()
    assert [json.loads(ln)["test"] for ln in lines] == ["pp8", "tg4"]


@pytest.mark.slow
def test_bench_cost_columns(smollm2_path, isolated_home):
    rows, _ = _bench_json("-m", str(smollm2_path), "-p", "8", "-n", "4", "-r", "1", "-t", "1",
                          "--price-per-hour", "3.6", "--compare-api-price", "0.5,2")
    pp, tg = rows
    assert pp["cost"]["per_million_tokens"] == pytest.approx(3.6e6 / 3600 / pp["avg_ts"], rel=1e-3)
    assert tg["cost"]["per_request"] == pytest.approx(3.6 * tg["samples_ns"][0] / 1e9 / 3600, rel=1e-3)
    assert pp["cost"]["api_per_million_tokens"] == 0.5 and tg["cost"]["api_per_million_tokens"] == 2.0


@pytest.mark.slow
def test_bench_results_go_to_the_history(smollm2_path, isolated_home):
    _bench_json("-m", str(smollm2_path), "-p", "8", "-n", "4", "-r", "2", "-t", "1")
    recs = history.load_records(command="bench")
    assert [r.extra["test"] for r in recs] == ["pp8", "tg4"]
    assert recs[0].prompt_eval_tokens == 16 and recs[0].prefill_tps and recs[0].decode_tps is None
    assert recs[1].completion_tokens == 8 and recs[1].decode_tps
    _bench_json("--no-log", "-m", str(smollm2_path), "-p", "8", "-n", "0", "-r", "1", "-t", "1")
    assert len(history.load_records(command="bench")) == 2


def test_bench_context_too_small_is_a_usage_error(smollm2_path, isolated_home):
    proc = run_cli("bench", "-m", str(smollm2_path), "-p", "512", "-n", "0", "-c", "64", "-t", "1")
    assert proc.returncode == 2
    assert b"--ctx-size 64 is too small for pp512" in proc.stderr
    assert proc.stdout == b""


@pytest.mark.parametrize("extra", [[], ["--parallel", "2"]], ids=["sequential", "parallel"])
def test_bench_loads_through_the_one_loader_its_preflight_refuses_what_does_not_fit(smollm2_path, isolated_home, extra):
    # bench loads as run does: a model that does not fit the memory is refused with the pre-flight's
    # figures (exit 6) before llama.cpp is asked for it, instead of being loaded into a swapping machine;
    # --force tries anyway, as with run
    from localinfer.system.hardware import FAKE_RAM_ENV

    env = {FAKE_RAM_ENV: "20MB"}
    proc = run_cli("bench", "-m", str(smollm2_path), "-p", "8", "-n", "4", "-r", "1", "-t", "1", *extra, env=env)
    assert proc.returncode == 6, proc.stderr
    assert b"not enough memory" in proc.stderr and b"20.0 MB is available" in proc.stderr
    assert b"Traceback" not in proc.stderr and proc.stdout == b""
    forced = run_cli("bench", "-m", str(smollm2_path), "-p", "8", "-n", "4", "-r", "1", "-t", "1", "-o", "json", "--force", *extra, env=env)
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)


@pytest.mark.slow
def test_a_schema_adds_a_constrained_row_with_its_cost_per_token(smollm2_path, isolated_home, tmp_path):
    # issue 27: a bench row with a schema shows the per-token overhead against the same row without
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 40}))
    rows, _ = _bench_json("-m", str(smollm2_path), "-p", "8", "-n", "16", "-r", "2", "-t", "1", "--json-schema-file", str(schema))
    assert [r["test"] for r in rows] == ["pp8", "tg16", "tg16 [json_schema]"]
    plain, constrained = rows[1], rows[2]
    assert "constraint" not in plain and constrained["constraint"] == "json_schema"
    assert constrained["samples_tokens"] == [16, 16]  # 40 items need more than 16 tokens: never cut short
    assert constrained["constraint_ratio"] == pytest.approx(constrained["avg_ts"] / plain["avg_ts"], rel=1e-3)
    assert isinstance(constrained["constraint_us_per_token"], float)
    # a document that ends early counts the tokens up to its end, not an error
    short = tmp_path / "b.json"
    short.write_text(json.dumps({"type": "boolean"}))
    rows, _ = _bench_json("-m", str(smollm2_path), "-p", "0", "-n", "16", "-r", "1", "-t", "1", "--json-schema-file", str(short))
    assert rows[1]["test"] == "tg16 [json_schema]" and 1 <= rows[1]["samples_tokens"][0] < 16
    proc = run_cli("bench", "-m", str(smollm2_path), "--parallel", "2", "--format", "json", "-t", "1")
    assert proc.returncode == 2 and b"not --parallel" in proc.stderr


@pytest.mark.llama
def test_bench_bad_list_is_a_usage_error(isolated_home):
    proc = run_cli("bench", "-t", "one,two")
    assert proc.returncode == 2
    assert b"--threads" in proc.stderr


@pytest.mark.llama
def test_bench_watts_without_price_is_a_usage_error(isolated_home):
    proc = run_cli("bench", "--watts", "100")
    assert proc.returncode == 2
    assert b"--kwh-price" in proc.stderr


@pytest.mark.slow
def test_parallel_requests_through_the_batch_engine(smollm2_path, isolated_home):
    rows, _ = _bench_json("-m", str(smollm2_path), "-p", "8", "-n", "4", "-r", "2", "-t", "1", "--parallel", "1,3")
    assert [r["test"] for r in rows] == ["pp8+tg4 x1", "pp8+tg4 x3"]
    for r, n in zip(rows, (1, 3)):
        assert r["kind"] == "parallel" and r["n_parallel"] == n and r["reps"] == 2
        assert r["samples_tokens"] == [4 * n, 4 * n]  # every sequence generated exactly -n tokens
        for ts, ns, tok in zip(r["samples_ts"], r["samples_ns"], r["samples_tokens"]):
            assert ts == pytest.approx(tok / (ns / 1e9), rel=1e-3)
        assert 0 < r["ttft_p50_ms"] <= r["ttft_p95_ms"] <= r["latency_p95_ms"]
        assert r["ttft_p50_ms"] < r["latency_p50_ms"]
    assert [r.extra["test"] for r in history.load_records(command="bench")] == ["pp8+tg4 x1", "pp8+tg4 x3"]


@pytest.mark.slow
def test_bench_on_a_terminal_with_no_color_shows_plain_progress(smollm2_path, isolated_home):
    import os
    import sys

    import pexpect

    child = pexpect.spawn(
        sys.executable, ["-m", "localinfer", "bench", "-m", str(smollm2_path), "-p", "8", "-n", "4", "-r", "1", "-t", "1"],
        env={**os.environ, "NO_COLOR": "1"}, timeout=300, dimensions=(50, 220),
    )
    child.expect(pexpect.EOF)
    child.close()
    out = child.before
    assert child.exitstatus == 0, out
    assert b"bench: tg4: repetition 1/1" in out  # progress lines on the terminal's stderr
    assert b"\x1b[" not in out and "pp8".encode() in out and "±".encode() in out


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("columns", [80, 60])
def test_the_table_at_80_and_60_columns_drops_columns_and_cuts_no_cell(monkeypatch, columns):
    # Rich squeezed every column to fit: "smollm2:1…", "302.12 ± 0…", the test column "…" (issue 31).
    from localinfer.render.bench import cell, columns as table_columns, print_table

    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setenv("NO_COLOR", "1")
    rows = [dict(model="smollm2:135m", model_size=98_362_432, quant="Q4_1", model_n_params=134_515_008, backend="CPU",
                 n_gpu_layers=0, n_threads=2, n_batch=2048, test=test, avg_ts=ts, stddev_ts=0.53, raw_avg_ts=ts * 1.1)
            for test, ts in (("pp512", 302.12), ("tg128", 41.5), ("pp512 @ d4096", 120.5))]  # fmt: skip
    out = _Terminal()
    print_table(rows, table_columns(rows, None), out)
    text = out.getvalue()
    lines = text.splitlines()
    assert "…" not in text and max(map(len, lines)) <= columns, text
    for r in rows:  # what a bench is for, whole on every row
        assert re.search(rf"smollm2:135m\s+.*{re.escape(r['test'])}\s+.*{re.escape(cell(r, '_tps'))}", text), text
    note = next(line for line in lines if line.startswith("not shown at"))
    assert note.startswith(f"not shown at {columns} columns: raw t/s, params, backend")
    shown = lines[1]
    assert "raw t/s" not in shown and "params" not in shown and "model" in shown and "t/s" in shown


def test_bench_help_says_what_quiet_and_verbose_do_in_bench():
    # They read as run's ("only the answer", "a full stats table"): bench has neither (issue 31).
    from typer.testing import CliRunner

    from localinfer.cli.main import build_app

    res = CliRunner().invoke(build_app(), ["bench", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    text = " ".join(res.stdout.split())
    assert "No progress lines on stderr; only the results on stdout." in text
    assert "Show llama.cpp's log while models load and run." in text
    assert "only the answer" not in text and "full stats table" not in text


@pytest.mark.slow
def test_draft_adds_ngram_rows_on_a_copy_and_a_free_prompt(smollm2_path, isolated_home):
    # issue 39: tg rows with speculative decoding, each against the same prompt without it
    rows, _ = _bench_json("-m", str(smollm2_path), "-p", "0", "-n", "16", "-r", "2", "-t", "1", "--draft", "ngram")
    assert [r["test"] for r in rows] == ["tg16", "tg16 [ngram copy]", "tg16 [ngram free]"]
    for row in rows[1:]:
        assert row["samples_tokens"] == [16, 16] and row["plain_avg_ts"] > 0
        assert row["draft_ratio"] == pytest.approx(row["avg_ts"] / row["plain_avg_ts"], rel=1e-3)
        assert 0 <= row["draft_accepted"] <= row["draft_tokens"]
    assert "draft" not in rows[0]
