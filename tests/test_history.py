"""The usage history: SQLite in the data dir, cheap and safe to write, never fatal, several writers at once."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

import pytest

from localinfer.usage import history, recorder
from localinfer.errors import ContextOverflowError, UsageError
from localinfer.usage.history import UsageRecord



def test_append_then_load_round_trips_every_field(isolated_home):
    rec = UsageRecord(
        command="run", model="smollm2:135m", model_sha256="ab" * 32, prompt_tokens=30, prompt_eval_tokens=20,
        cached_tokens=10, completion_tokens=7, ttft_ms=120.5, prefill_tps=300.0, decode_tps=40.0, load_ms=200.0,
        total_ms=400.0, finish_reason="length", exit_status=0, extra={"test": "tg8"}, ts=1_700_000_000.0,
    )
    assert history.append(rec) is True
    assert history.db_path() == isolated_home / "history.db"
    assert history.load_records() == [rec]


def test_database_is_in_wal_mode(isolated_home):
    history.append(UsageRecord(command="run", model="m"))
    conn = sqlite3.connect(history.db_path())
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == history.SCHEMA_VERSION


def test_no_history_is_an_empty_list(isolated_home):
    assert history.load_records() == []
    assert not history.db_path().exists()


def test_filters_by_time_model_and_command(isolated_home):
    history.append([
        UsageRecord(command="run", model="a", ts=100.0),
        UsageRecord(command="bench", model="a", ts=200.0),
        UsageRecord(command="run", model="b", model_sha256="cafe", ts=300.0),
    ])
    assert [r.ts for r in history.load_records(since=150.0)] == [200.0, 300.0]
    assert [r.ts for r in history.load_records(model="a")] == [100.0, 200.0]
    assert [r.ts for r in history.load_records(model="cafe")] == [300.0]
    assert [r.ts for r in history.load_records(command="run")] == [100.0, 300.0]


def test_no_log_switches(monkeypatch):
    monkeypatch.delenv("LOCALINFER_NO_LOG", raising=False)
    assert history.logging_enabled() is True
    assert history.logging_enabled(no_log=True) is False
    monkeypatch.setenv("LOCALINFER_NO_LOG", "1")
    assert history.logging_enabled() is False
    monkeypatch.setenv("LOCALINFER_NO_LOG", "0")
    assert history.logging_enabled() is True


def _Result():
    from localinfer.answer.answer import Answer
    from localinfer.engine.types import GenerationStats

    stats = GenerationStats(prompt_tokens=12, cached_tokens=2, completion_tokens=5, finish_reason="stop")
    return Answer("the answer", "m", stats, load_s=0.5, ttft_s=0.1, total_s=0.3)


def test_text_is_kept_only_when_the_user_opts_in(monkeypatch):
    monkeypatch.delenv("LOCALINFER_LOG_TEXT", raising=False)
    rec = recorder.record_of("run", _Result(), None, prompt_text="secret prompt")
    assert rec.prompt_text is None and rec.answer_text is None
    monkeypatch.setenv("LOCALINFER_LOG_TEXT", "1")
    rec = recorder.record_of("run", _Result(), None, prompt_text="secret prompt")
    assert rec.prompt_text == "secret prompt" and rec.answer_text == "the answer"


def test_record_of_converts_units():
    rec = recorder.record_of("run", _Result(), None)
    assert (rec.prompt_tokens, rec.prompt_eval_tokens, rec.cached_tokens, rec.completion_tokens) == (12, 10, 2, 5)
    assert rec.ttft_ms == pytest.approx(100.0) and rec.total_ms == pytest.approx(300.0) and rec.load_ms == pytest.approx(500.0)
    assert rec.finish_reason == "stop" and rec.exit_status == 0


def test_exit_status_follows_the_error_table():
    assert history.exit_status_of(None) == 0
    assert history.exit_status_of(UsageError("x")) == 2
    assert history.exit_status_of(ContextOverflowError("x")) == 6
    assert history.exit_status_of(KeyboardInterrupt()) == 130
    assert history.exit_status_of(BrokenPipeError()) == 141
    assert history.exit_status_of(RuntimeError("boom")) == 1


class _Resolved:
    name, sha256 = "smollm2:135m", "f00d"


def test_recording_writes_failures_with_their_exit_status(isolated_home):
    with pytest.raises(ContextOverflowError):
        with recorder.recording("run") as rec:
            rec.model = _Resolved()
            raise ContextOverflowError("too long")
    (row,) = history.load_records()
    assert (row.command, row.model, row.model_sha256, row.exit_status, row.finish_reason) == ("run", "smollm2:135m", "f00d", 6, "error")


def test_recording_without_a_model_writes_nothing(isolated_home):
    with pytest.raises(UsageError):
        with recorder.recording("run"):
            raise UsageError("no prompt")
    assert history.load_records() == []


def test_recording_respects_no_log(isolated_home):
    with recorder.recording("run", no_log=True) as rec:
        rec.model = _Resolved()
    assert history.load_records() == []


def test_corrupt_database_is_a_warning_not_a_failure(isolated_home):
    isolated_home.mkdir(parents=True, exist_ok=True)
    history.db_path().write_bytes(b"this is not a database" * 100)
    warnings = []
    assert history.append(UsageRecord(command="run", model="m"), warn=warnings.append) is False
    assert len(warnings) == 1 and "usage history" in warnings[0]


def test_locked_database_is_a_warning_after_the_busy_timeout(isolated_home, monkeypatch):
    history.append(UsageRecord(command="run", model="m"))
    monkeypatch.setattr(history, "BUSY_TIMEOUT_MS", 100)
    holder = sqlite3.connect(history.db_path(), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        warnings = []
        assert history.append(UsageRecord(command="run", model="m"), warn=warnings.append) is False
        assert "locked" in warnings[0]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert len(history.load_records()) == 1


def test_recording_survives_a_broken_database(isolated_home, capsys):
    from localinfer.render.stats import warn  # what the commands pass

    isolated_home.mkdir(parents=True, exist_ok=True)
    history.db_path().write_bytes(b"garbage" * 1000)
    with recorder.recording("run", warn=warn) as rec:
        rec.model = _Resolved()
    assert "warning: could not record" in capsys.readouterr().err


def test_the_history_never_prints_its_warnings_itself(isolated_home, capfd):
    isolated_home.mkdir(parents=True, exist_ok=True)
    history.db_path().write_bytes(b"garbage" * 1000)
    assert history.append(UsageRecord(command="run", model="m")) is False  # no warn: nobody told
    with recorder.recording("run") as rec:
        rec.model = _Resolved()
    log = recorder.RequestLog("batch", _Resolved())
    log.wrap(lambda r: None)(ANSWER)
    log.flush()
    assert capfd.readouterr() == ("", "")
    warnings: list[str] = []
    log = recorder.RequestLog("batch", _Resolved(), warn=warnings.append)
    log.wrap(lambda r: None)(ANSWER)
    log.flush()
    assert len(warnings) == 1 and "could not record" in warnings[0]


WRITER = textwrap.dedent(
    """
    import sys
    from localinfer.usage import history
    ok = 0
    for i in range(int(sys.argv[2])):
        ok += history.append(history.UsageRecord(command="run", model="w" + sys.argv[1], completion_tokens=i))
    sys.exit(0 if ok == int(sys.argv[2]) else 1)
    """
)


def test_concurrent_writers_lose_nothing_and_keep_the_database_sound(isolated_home):
    # Several processes create the database and write to it at the same time.
    writers, each = 6, 60
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(w), str(each)], stderr=subprocess.PIPE)
        for w in range(writers)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    rows = history.load_records()
    assert len(rows) == writers * each
    for w in range(writers):
        assert sorted(r.completion_tokens for r in rows if r.model == f"w{w}") == list(range(each))
    conn = sqlite3.connect(history.db_path())
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# -- many requests per command (batch) ---------------------------------------------------------------

ANSWER = {
    "id": 1, "text": "hello", "finish_reason": "length",
    "usage": {"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34},
    "timings": {"ttft_ms": 150.0, "prefill_ms": 100.0, "decode_ms": 60.0, "decode_tokens_per_s": 50.0, "total_ms": 200.0},
}


def test_request_log_passes_records_on_and_writes_one_row_each(isolated_home, monkeypatch):
    monkeypatch.delenv("LOCALINFER_LOG_TEXT", raising=False)
    written = []
    log = recorder.RequestLog("batch", _Resolved(), extra={"parallel": 4})
    write = log.wrap(written.append)
    write(ANSWER)
    write({"id": 2, "line": 2, "error": "not valid JSON: the secret line"})
    log.flush()
    assert written == [ANSWER, {"id": 2, "line": 2, "error": "not valid JSON: the secret line"}]
    ok, err = history.load_records()
    assert (ok.command, ok.model, ok.model_sha256, ok.exit_status) == ("batch", "smollm2:135m", "f00d", 0)
    assert (ok.prompt_tokens, ok.completion_tokens, ok.ttft_ms, ok.decode_tps, ok.total_ms) == (30, 4, 150.0, 50.0, 200.0)
    assert ok.prefill_tps == pytest.approx(300.0) and ok.answer_text is None and ok.extra == {"parallel": 4}
    assert err.exit_status == 1 and err.finish_reason == "error"
    assert err.extra == {"parallel": 4, "error": True}  # the message may quote input: only with LOG_TEXT


def test_request_log_records_a_failing_job_from_finally(isolated_home):
    log = recorder.RequestLog("batch", _Resolved())
    with pytest.raises(ContextOverflowError):
        try:
            log.wrap(lambda r: None)(ANSWER)
            raise ContextOverflowError("abort")
        finally:
            log.flush()
    rows = history.load_records()
    assert [r.exit_status for r in rows] == [0, 6]
    assert rows[1].extra == {"job": True}


def test_request_log_flushes_in_groups(isolated_home):
    log = recorder.RequestLog("batch", _Resolved(), flush_every=3, flush_s=3600)
    write = log.wrap(lambda r: None)
    for _ in range(4):
        write(ANSWER)
    assert len(history.load_records()) == 3  # one transaction for the first three
    log.flush()
    assert len(history.load_records()) == 4


def test_request_log_respects_no_log(isolated_home):
    log = recorder.RequestLog("batch", _Resolved(), no_log=True)
    log.wrap(lambda r: None)(ANSWER)
    log.flush()
    assert history.load_records() == []


@pytest.mark.llama
def test_batch_command_records_every_request(smollm2_path, isolated_home, fake_backend):  # noqa: F811
    from typer.testing import CliRunner

    from localinfer.cli.main import build_app

    proc = CliRunner().invoke(build_app(), ["batch", "-", "-m", str(smollm2_path), "-n", "3", "-t", "1", "--parallel", "2",
                              "-q", "--input-format", "jsonl"], input='{"prompt": "Hi"}\n{"prompt": "Hello"}\nnot json\n')  # fmt: skip
    assert proc.exit_code == 0, proc.stderr
    rows = history.load_records(command="batch")
    assert sorted(r.exit_status for r in rows) == [0, 0, 1]
    assert sum(r.completion_tokens for r in rows) == 6
    assert all(r.model == str(smollm2_path) for r in rows)
