"""`localinfer stats`: the history summed per model and per day; `run` writes the history it reads."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import sqlite3
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from conftest import run_cli
from localinfer.usage import history
from localinfer.usage import stats as usage
from localinfer.cli.main import build_app
from localinfer.usage.cost import pricing
from localinfer.errors import UsageError
from localinfer.usage.history import UsageRecord

ANSI = re.compile(r"\x1b\[")


def _ts(day: str, hour: int = 12) -> float:
    return dt.datetime.fromisoformat(f"{day}T{hour:02d}:00:00").timestamp()


def _sample() -> list[UsageRecord]:
    return [
        UsageRecord(command="run", model="small", prompt_tokens=10, prompt_eval_tokens=10, completion_tokens=5,
                    ttft_ms=100.0, decode_tps=50.0, prefill_tps=500.0, total_ms=1000.0, load_ms=500.0, ts=_ts("2025-03-01")),
        UsageRecord(command="run", model="small", prompt_tokens=20, prompt_eval_tokens=15, cached_tokens=5,
                    completion_tokens=15, ttft_ms=200.0, decode_tps=40.0, prefill_tps=400.0, total_ms=2000.0, ts=_ts("2025-03-01", 13)),
        UsageRecord(command="run", model="small", prompt_tokens=30, prompt_eval_tokens=30, completion_tokens=0,
                    exit_status=6, finish_reason="error", ts=_ts("2025-03-03")),
        UsageRecord(command="chat", model="large", prompt_tokens=100, prompt_eval_tokens=100, completion_tokens=100,
                    ttft_ms=900.0, decode_tps=10.0, prefill_tps=80.0, total_ms=11000.0, ts=_ts("2025-03-03", 9)),
    ]


def test_percentile_interpolates_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert usage.percentile(values, 50) == 3.0
    assert usage.percentile(values, 95) == pytest.approx(4.8)
    assert usage.percentile([10.0, 20.0], 50) == 15.0
    assert usage.percentile([7.0], 95) == 7.0
    assert usage.percentile([], 50) is None


def test_parse_since_durations_and_dates():
    now = 1_000_000.0
    assert usage.parse_since("7d", now) == now - 7 * 86400
    assert usage.parse_since("12h", now) == now - 12 * 3600
    assert usage.parse_since("30m", now) == now - 1800
    assert usage.parse_since("2w", now) == now - 14 * 86400
    assert usage.parse_since("2025-01-31") == dt.datetime(2025, 1, 31).timestamp()
    assert usage.parse_since(None) is None
    with pytest.raises(UsageError):
        usage.parse_since("last tuesday")


def test_summary_per_model_and_per_day():
    s = usage.summarize(_sample())
    t = s["totals"]
    assert (t["requests"], t["failed"], t["tokens_in"], t["tokens_out"]) == (4, 1, 160, 120)
    assert t["tokens_in_cached"] == 5 and t["tokens_in_evaluated"] == 155
    large, small = s["models"]  # busiest first
    assert large["model"] == "large" and small["model"] == "small"
    assert (small["requests"], small["failed"], small["tokens_in"], small["tokens_out"]) == (3, 1, 60, 20)
    assert small["ttft_ms_p50"] == 150.0 and small["ttft_ms_p95"] == pytest.approx(195.0)
    assert small["decode_tps_p50"] == 45.0
    assert small["busy_s"] == pytest.approx(3.5)  # request time plus load time
    # Per local day, with the empty day in between kept for the chart.
    assert [d["day"] for d in s["days"]] == ["2025-03-01", "2025-03-02", "2025-03-03"]
    assert [d["requests"] for d in s["days"]] == [2, 0, 2]
    assert [d["tokens_out"] for d in s["days"]] == [20, 0, 100]


def test_summary_cost_from_busy_time_and_api_prices():
    p = pricing(price_per_hour=3.6, compare_api_price="1,2")  # 0.001 per second
    s = usage.summarize(_sample(), p)
    small = next(m for m in s["models"] if m["model"] == "small")
    assert small["cost"]["total"] == pytest.approx(0.0035)
    assert small["cost"]["per_request"] == pytest.approx(0.0035 / 3)
    assert small["cost"]["per_million_tokens_out"] == pytest.approx(0.0035 / 20 * 1e6)
    assert small["cost"]["api_total"] == pytest.approx((60 * 1 + 20 * 2) / 1e6)
    assert s["pricing"]["hourly"] == pytest.approx(3.6)


def _seed(records):
    assert history.append(records)


def test_stats_json_through_the_cli(isolated_home):
    _seed(_sample())
    res = CliRunner().invoke(build_app(), ["stats", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["totals"]["requests"] == 4
    assert {m["model"] for m in data["models"]} == {"small", "large"}
    assert data["database"] == str(isolated_home / "history.db")


def test_stats_filters_model_command_since(isolated_home):
    _seed(_sample() + [UsageRecord(command="run", model="small", completion_tokens=3, ts=dt.datetime.now().timestamp())])
    app = build_app()
    data = json.loads(CliRunner().invoke(app, ["stats", "--json", "--model", "large"]).stdout)
    assert data["totals"]["requests"] == 1 and data["models"][0]["model"] == "large"
    data = json.loads(CliRunner().invoke(app, ["stats", "--json", "--command", "chat"]).stdout)
    assert data["totals"]["tokens_out"] == 100
    data = json.loads(CliRunner().invoke(app, ["stats", "--json", "--since", "1d"]).stdout)
    assert data["totals"]["requests"] == 1 and data["totals"]["tokens_out"] == 3


def test_stats_tables_and_charts_without_ansi(isolated_home):
    _seed(_sample())
    res = CliRunner().invoke(build_app(), ["stats", "--price-per-hour", "3.6"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert not ANSI.search(out)
    assert "Per model" in out and "Tokens per day" in out and "Decode tok/s per model" in out
    assert "small" in out and "large" in out and "2025-03-02" in out
    assert "█" in out  # the bar charts
    assert not set("│┃━┏┡╇") & set(out)  # not a terminal: plain text, no box drawing (issue 21)
    day_lines = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("2025-03-0")]
    # 2025-03-03 has 200 tokens, the most: the longest bar; the empty day has none.
    bars = {ln[:10]: ln.count("█") for ln in day_lines}
    assert bars["2025-03-03"] > bars["2025-03-01"] > bars["2025-03-02"] == 0


def test_stats_on_an_empty_history(isolated_home):
    res = CliRunner().invoke(build_app(), ["stats"])
    assert res.exit_code == 0
    assert "No requests recorded" in res.stdout


def test_stats_bad_since_is_a_usage_error(isolated_home):
    res = CliRunner().invoke(build_app(), ["stats", "--since", "soon"])
    assert res.exit_code == 2
    assert "--since" in res.stderr


# -- end to end: `run` writes, `stats` reads ------------------------------------------------------


@pytest.mark.slow
def test_run_records_its_request_and_stats_reads_it(smollm2_path, isolated_home):
    proc = run_cli("run", "--json", "-m", str(smollm2_path), "-n", "6", "--seed", "3", "-t", "1", "-p", "Say hi")
    assert proc.returncode == 0, proc.stderr.decode()
    out = json.loads(proc.stdout)
    (rec,) = history.load_records()
    assert rec.command == "run" and rec.exit_status == 0
    # a file used in place is hashed once, on first use (the load probe's verdict is keyed by it)
    assert rec.model == str(smollm2_path) and rec.model_sha256 == hashlib.sha256(smollm2_path.read_bytes()).hexdigest()
    assert rec.prompt_tokens == out["usage"]["prompt_tokens"]
    assert rec.completion_tokens == out["usage"]["completion_tokens"]
    assert rec.ttft_ms == pytest.approx(out["timings"]["ttft_ms"], abs=0.01)
    assert rec.decode_tps == pytest.approx(out["timings"]["decode_tokens_per_s"], abs=0.01)
    assert rec.finish_reason == out["finish_reason"]
    assert rec.prompt_text is None and rec.answer_text is None  # no text unless opted in

    stats = run_cli("stats", "--json")
    assert stats.returncode == 0
    data = json.loads(stats.stdout)
    assert data["totals"]["requests"] == 1
    assert data["totals"]["tokens_out"] == out["usage"]["completion_tokens"]


@pytest.mark.slow
def test_run_records_the_registry_sha_and_text_on_opt_in(smollm2_path, isolated_home):
    proc = run_cli("run", "-q", "-n", "4", "--seed", "1", "-t", "1", "-p", "Hello there", env={"LOCALINFER_LOG_TEXT": "1"})
    assert proc.returncode == 0, proc.stderr.decode()
    (rec,) = history.load_records()
    assert rec.model == "smollm2:135m" and len(rec.model_sha256 or "") == 64
    assert rec.prompt_text == "Hello there"
    assert rec.answer_text and rec.answer_text.strip() in proc.stdout.decode()


@pytest.mark.slow
def test_failed_run_is_recorded_with_its_exit_status(smollm2_path, isolated_home):
    proc = run_cli("run", "-m", str(smollm2_path), "-c", "64", "-n", "8", "-t", "1", "-p", "word " * 1000)
    assert proc.returncode == 6, proc.stderr.decode()
    (rec,) = history.load_records()
    assert rec.exit_status == 6 and rec.finish_reason == "error" and rec.model == str(smollm2_path)


@pytest.mark.llama
def test_no_log_flag_and_env_write_nothing(smollm2_path, isolated_home, fake_backend):  # noqa: F811
    assert _invoke("run", "--no-log", "-q", "-m", str(smollm2_path), "-n", "2", "-t", "1", "-p", "Hi").returncode == 0
    proc = _invoke("run", "-q", "-m", str(smollm2_path), "-n", "2", "-t", "1", "-p", "Hi", env={"LOCALINFER_NO_LOG": "1"})
    assert proc.returncode == 0
    assert history.load_records() == []
    assert len(fake_backend.requests) == 2  # both answered


def _invoke(*args: str, env: dict | None = None):
    """The command in this process (CliRunner, on the fake backend), its outcome shaped as run_cli's."""
    import types

    res = CliRunner().invoke(build_app(), list(args), env=env)
    return types.SimpleNamespace(returncode=res.exit_code, stdout=res.stdout_bytes, stderr=res.stderr_bytes)


@pytest.mark.llama
def test_run_with_a_broken_history_still_answers(smollm2_path, isolated_home, fake_backend):  # noqa: F811
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "history.db").write_bytes(b"not sqlite" * 500)
    proc = _invoke("run", "-m", str(smollm2_path), "-n", "4", "--seed", "1", "-t", "1", "-p", "Hi")
    assert proc.returncode == 0
    assert proc.stdout.strip()
    assert b"warning: could not record this request in the usage history" in proc.stderr


@pytest.mark.slow
def test_two_runs_at_once_are_both_recorded(smollm2_path, isolated_home):
    cmd = [sys.executable, "-m", "localinfer", "run", "-q", "-m", str(smollm2_path), "-n", "4", "-t", "1", "-p", "Hi"]
    procs = [subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
    errs = []
    for p in procs:
        _, err = p.communicate(timeout=300)
        errs.append(err)
        assert p.returncode == 0, err.decode()
    assert len(history.load_records()) == 2, [e.decode() for e in errs]
    assert sqlite3.connect(history.db_path()).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def _in_a_terminal(args: list[str], env: dict[str, str], timeout: float = 120) -> bytes:
    import os

    import pexpect

    child = pexpect.spawn(sys.executable, ["-m", "localinfer", *args], env={**os.environ, **env}, timeout=timeout,
                          dimensions=(50, 220))
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    return child.before


def test_stats_on_a_terminal_is_styled_unless_no_color(isolated_home):
    _seed(_sample())
    styled = _in_a_terminal(["stats"], {"LOCALINFER_HOME": str(isolated_home)})
    assert b"\x1b[" in styled and "Per model".encode() in styled
    plain = _in_a_terminal(["stats"], {"LOCALINFER_HOME": str(isolated_home), "NO_COLOR": "1"})
    assert b"\x1b[" not in plain and "Per model".encode() in plain


def test_stats_at_80_columns_keeps_model_names_and_dates_whole(isolated_home):
    # At 80 columns the model column was zero-width, headers "re…", dates "2026…" (issue 21).
    import os

    import pexpect

    long_name = "qwen2.5-coder:7b-instruct-q4_k_m"
    _seed(_sample() + [UsageRecord(command="run", model=long_name, completion_tokens=7, ttft_ms=80.0,
                                   decode_tps=12.5, ts=_ts("2025-03-02"))])  # fmt: skip
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "80", "LINES": "60"}
    child = pexpect.spawn(sys.executable, ["-m", "localinfer", "stats"], env=env, encoding="utf-8", dimensions=(60, 80))
    child.expect(pexpect.EOF, timeout=60)
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", child.before)
    lines = out.replace("\r", "").splitlines()
    assert max(map(len, lines)) <= 80
    assert long_name in out and "…" not in out
    assert all(day in out for day in ("2025-03-01", "2025-03-02", "2025-03-03"))
    assert re.search(r"reqs\s+failed\s+in\s+out\s+TTFT ms\s+tok/s", out)


@pytest.mark.parametrize("columns", [80, 60])
def test_stats_too_wide_for_the_terminal_drops_columns_and_cuts_no_cell(isolated_home, columns):
    # A server's URL in the model column and millions of tokens: the token columns were cut ("1.…").
    import os

    import pexpect

    label = "gpt-4o @ http://127.0.0.1:8080/v1"
    _seed(_sample() + [
        UsageRecord(command="run", model="smollm2:135m", prompt_tokens=1_234_567, completion_tokens=7_654_321,
                    ttft_ms=100.0, decode_tps=50.0, ts=_ts("2025-03-01")),
        UsageRecord(command="run", model="gpt-4o", endpoint="http://127.0.0.1:8080/v1", prompt_tokens=20,
                    completion_tokens=15, ttft_ms=20000.0, decode_tps=1040.0, ts=_ts("2025-03-02")),
    ])  # fmt: skip
    env = {**os.environ, "TERM": "xterm", "COLUMNS": str(columns), "LINES": "60"}
    child = pexpect.spawn(sys.executable, ["-m", "localinfer", "stats"], env=env, encoding="utf-8",
                          dimensions=(60, columns))  # fmt: skip
    child.expect(pexpect.EOF, timeout=60)
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", child.before).replace("\r", "")
    assert "…" not in out and max(map(len, out.splitlines())) <= columns, out
    per_model = out[out.index("Per model") : out.index("Tokens per day")]
    assert re.search(r"model\s+reqs\s+in\s+out", per_model), per_model
    assert re.search(r"smollm2:135m\s+1\s+1\.2M\s+7\.7M", per_model) and label in per_model, per_model
    assert re.search(r"2025-03-01\s+3\s+1\.2M\s+7\.7M", out), out
    assert f"{label}  1040.0" in out  # the chart keeps the names and figures whole too
