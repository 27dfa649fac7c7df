"""`localinfer batch` without a model: input parsing, duplicate ids, resumable output, sizing, summary."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from localinfer.batch import io as batchio

from localinfer.batch import job as batchjob
from localinfer.batch.io import BatchRequest, InputError, parse_input, prepare_resume
from localinfer.errors import UsageError


# -- input ---------------------------------------------------------------------------------------


def test_jsonl_requests_with_options():
    data = "\n".join([
        json.dumps({"id": "a", "prompt": "Hi", "max_tokens": 5, "temperature": 0, "seed": 7, "stop": "x"}),
        "",
        json.dumps({"id": 3, "messages": [{"role": "user", "content": "Yo"}], "stop": ["a", "b"]}),
        json.dumps({"prompt": "no id"}),
    ])
    items = parse_input(data, "auto", name="reqs.jsonl")
    assert items == [
        BatchRequest(id="a", line=1, prompt="Hi", max_tokens=5, temperature=0.0, seed=7, stop=("x",)),
        BatchRequest(id=3, line=3, messages=({"role": "user", "content": "Yo"},), stop=("a", "b")),
        BatchRequest(id=4, line=4, prompt="no id"),  # a missing id is the line number
    ]


@pytest.mark.parametrize(
    ("line", "reason", "rid"),
    [
        ("{not json", "not valid JSON", None),
        ("[1, 2]", "must be a JSON object", None),
        ('{"id": true, "prompt": "x"}', "'id' must be a string or an integer", None),
        ('{"id": 1.5, "prompt": "x"}', "'id' must be a string or an integer", None),
        ('{"id": "u", "prompt": "x", "max_token": 3}', "unknown field 'max_token'", "u"),
        ('{"id": "b", "prompt": "x", "messages": []}', "exactly one of 'prompt' or 'messages'", "b"),
        ('{"id": "n"}', "exactly one of 'prompt' or 'messages'", "n"),
        ('{"id": "p", "prompt": 5}', "'prompt' must be a string", "p"),
        ('{"id": "m", "messages": [{"role": "user"}]}', "'messages[0]' must be an object", "m"),
        ('{"id": "m2", "messages": "hello"}', "'messages' must be a non-empty list", "m2"),
        ('{"id": "t", "prompt": "x", "max_tokens": 0}', "'max_tokens' must be an integer >= 1", "t"),
        ('{"id": "t2", "prompt": "x", "max_tokens": "9"}', "'max_tokens' must be an integer", "t2"),
        ('{"id": "k", "prompt": "x", "temperature": -1}', "'temperature' must be a number between 0 and 2", "k"),
        ('{"id": "s", "prompt": "x", "seed": -3}', "'seed' must be an integer between 0", "s"),
        ('{"id": "z", "prompt": "x", "stop": [1]}', "'stop' must be a string or a list of strings", "z"),
    ],
)
def test_bad_jsonl_lines_become_errors_with_line_numbers(line, reason, rid):
    items = parse_input('{"id": "ok", "prompt": "fine"}\n' + line + "\n", "jsonl")
    assert items[0] == BatchRequest(id="ok", line=1, prompt="fine")
    assert len(items) == 2
    err = items[1]
    assert isinstance(err, InputError)
    assert err.line == 2
    assert reason in err.reason
    assert err.id == rid


def test_text_input_ids_are_line_numbers_and_blank_lines_are_not_requests():
    items = parse_input(b"first prompt\r\n\n  \nsecond {not json}\n", "auto", name="-")
    assert items == [BatchRequest(id=1, line=1, prompt="first prompt"), BatchRequest(id=4, line=4, prompt="second {not json}")]


def test_format_detection_and_odd_bytes():
    assert batchio.detect_format('{"prompt": "x"}\n', None) == "jsonl"
    assert batchio.detect_format('{"prompt": "x"}\n', "prompts.txt") == "text"
    assert batchio.detect_format("hello\n", "data.jsonl") == "jsonl"
    assert batchio.detect_format("\n\nhello {x}\n", "-") == "text"
    items = parse_input(b'\xef\xbb\xbf{"id": 1, "prompt": "bom"}\n', "auto")
    assert items == [BatchRequest(id=1, line=1, prompt="bom")]
    bad = parse_input(b"ok\n\xff\xfe broken\n", "text")
    assert bad[0] == BatchRequest(id=1, line=1, prompt="ok")
    assert isinstance(bad[1], InputError) and bad[1].line == 2 and "UTF-8" in bad[1].reason
    with pytest.raises(UsageError):
        parse_input("x", "csv")


def test_duplicate_ids_are_a_usage_error_before_anything_runs():
    items = parse_input('{"id": 1, "prompt": "a"}\n{"id": "1", "prompt": "b"}\n{"id": 1, "prompt": "c"}\n', "jsonl")
    with pytest.raises(UsageError, match=r"duplicate ids in the input: 1 \(lines 1 and 3\)"):
        batchjob.check_items(items, "skip")
    # 1 and "1" are different ids; an error line without an id never clashes.
    batchjob.check_items(items[:2] + [InputError(9, "bad")], "skip")


def test_abort_refuses_a_bad_line_up_front():
    items = [BatchRequest(id=1, line=1, prompt="a"), InputError(2, "not valid JSON: x")]
    batchjob.check_items(items, "skip")
    with pytest.raises(UsageError, match="line 2: not valid JSON"):
        batchjob.check_items(items, "abort")


# -- output and resume --------------------------------------------------------------------------------


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_sink_writes_whole_lines(tmp_path):
    out = tmp_path / "out.jsonl"
    sink = batchio.JsonlSink(path=out)
    sink({"id": 1, "text": "é\nsecond line"})
    sink({"id": 2, "text": ""})
    sink.close()
    assert _lines(out) == [{"id": 1, "text": "é\nsecond line"}, {"id": 2, "text": ""}]
    sink = batchio.JsonlSink(path=out, append=True)
    sink({"id": 3})
    sink.close()
    assert [r["id"] for r in _lines(out)] == [1, 2, 3]
    batchio.JsonlSink(path=out).close()  # without --resume the file starts over
    assert out.read_bytes() == b""


def test_resume_cuts_a_torn_line_and_retries_errors(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(
        b'{"id": "a", "text": "A"}\n'
        b'{"id": null, "line": 4, "error": "not valid JSON"}\n'
        b'{"id": 2, "line": 2, "error": "too long"}\n'
        b'{"id": 2, "text": "B"}\n'
        b'{"id": "c", "te'
    )
    done = prepare_resume(out)
    assert done == {batchjob.id_key("a"), batchjob.id_key(2)}
    assert out.read_bytes() == b'{"id": "a", "text": "A"}\n{"id": 2, "text": "B"}\n'


def test_resume_only_truncates_when_nothing_else_changes(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(b'{"id": 1, "text": "x"}\n{"id": 2, "text": "y"}\n{"id": 3')
    inode = out.stat().st_ino
    assert prepare_resume(out) == {"1", "2"}
    assert out.read_bytes() == b'{"id": 1, "text": "x"}\n{"id": 2, "text": "y"}\n'
    assert out.stat().st_ino == inode
    assert prepare_resume(tmp_path / "missing.jsonl") == set()


def test_resume_refuses_a_file_that_is_not_batch_output(tmp_path):
    out = tmp_path / "notes.jsonl"
    out.write_text('{"id": 1, "text": "x"}\nmy shopping list\n{"id": 2, "text": "y"}\n')
    with pytest.raises(UsageError, match="line 2 is not a batch result"):
        prepare_resume(out)
    assert "shopping" in out.read_text()  # left as it was


# -- sizing and summary ------------------------------------------------------------------------------


def test_default_parallel_from_cores_memory_and_requests():
    kw = dict(kv_bytes_per_seq=100 * 2**20, available_bytes=64 * 2**30, gpu=False)
    assert batchjob.default_parallel(1000, physical_cores=2, **kw) == 8
    assert batchjob.default_parallel(1000, physical_cores=1, **kw) == 4
    assert batchjob.default_parallel(1000, physical_cores=64, **kw) == 16
    assert batchjob.default_parallel(3, physical_cores=2, **kw) == 3
    assert batchjob.default_parallel(1000, physical_cores=2, kv_bytes_per_seq=2**30, available_bytes=6 * 2**30, gpu=False) == 3
    assert batchjob.default_parallel(1000, physical_cores=2, kv_bytes_per_seq=2**30, available_bytes=2**29, gpu=False) == 1
    assert batchjob.default_parallel(1000, physical_cores=2, kv_bytes_per_seq=None, available_bytes=None, gpu=True) == 16


def test_batch_load_options_make_one_context_of_per_sequence_windows():
    from localinfer.engine.types import LoadOptions

    opts = batchjob.batch_load_options(LoadOptions(n_threads=2, n_batch=4), parallel=8, ctx_per_seq=512)
    assert (opts.n_ctx, opts.n_seq_max, opts.n_batch, opts.n_threads) == (4096, 8, 8, 2)
    with pytest.raises(UsageError):
        batchjob.batch_load_options(LoadOptions(), parallel=0, ctx_per_seq=512)


def test_kv_bytes_per_token_from_the_gguf_header(smollm2_path):
    from localinfer.gguf import read_gguf
    from localinfer.store.types import ResolvedModel

    resolved = ResolvedModel("smollm2", smollm2_path, None, "local", None, read_gguf(smollm2_path))
    # 30 layers x 3 KV heads x 64 dims x (K + V) x 2 bytes (f16)
    assert batchjob.kv_bytes_per_token(resolved) == 30 * 3 * 64 * 2 * 2
    assert batchjob.kv_bytes_per_token(resolved, "q8_0", "q8_0") == int(30 * 3 * 64 * 2 * 34 / 32)


def test_summary_percentiles_and_lines():
    from localinfer.render.batch import progress_line, summary_lines

    s = batchjob.BatchSummary(requests=12, skipped=2, completed=9, errors=1, prompt_tokens=300, completion_tokens=450,
                              wall_s=3.0, parallel=4, latencies=[float(i) for i in range(1, 10)], decode_tps=200.0)
    assert s.latency(0.5) == 5.0 and s.latency(0.95) == 9.0
    assert s.tokens_per_s == 150.0
    head, body = summary_lines(s, "smollm2:135m")
    assert head == "batch: 12 requests (2 already in the output) · 9 answered · 1 error · smollm2:135m"
    assert "300 prompt, 450 completion" in body and "150.0 tok/s (decode 200.0 tok/s) at parallel 4" in body
    assert "p50 5.00 s, p95 9.00 s" in body
    assert progress_line(s, 10) == "batch: 10/10 requests (1 error), 150.0 tok/s, ETA 0.00 s"
    few = batchjob.BatchSummary(requests=3, completed=3, completion_tokens=30, wall_s=1.0, parallel=16, latencies=[1.0] * 3)
    assert "at parallel 3 · " in summary_lines(few)[1]  # what ran at once, not the --parallel asked for
    assert batchjob.BatchSummary().latency(0.5) is None


def test_plain_progress_is_periodic_and_quiet_at_the_end():
    import io

    from localinfer.render.batch import PlainBatchProgress

    out = io.StringIO()
    progress = PlainBatchProgress(out, interval=0.0)
    progress(batchjob.BatchSummary(completed=3, completion_tokens=30, wall_s=2.0), 10)
    progress(batchjob.BatchSummary(completed=10, completion_tokens=100, wall_s=5.0), 10)  # the summary follows
    assert out.getvalue() == "batch: 3/10 requests, 15.0 tok/s, ETA 4.67 s\n"
    slow = io.StringIO()
    progress = PlainBatchProgress(slow, interval=3600.0)
    progress(batchjob.BatchSummary(completed=3, wall_s=2.0), 10)
    assert slow.getvalue() == ""


def test_a_template_the_sandbox_refuses_fails_the_job_up_front(tmp_path):
    from localinfer.engine.templates import ChatTemplate, TemplateRefusedError
    from localinfer.generate.loading import LoadedModel

    marker = tmp_path / "pwned"
    evil = "{{ cycler.__init__.__globals__.os.popen('touch " + str(marker) + "').read() }}"
    with pytest.raises(TemplateRefusedError, match="refused by the sandbox"):
        batchjob.check_template(LoadedModel("m", None, ChatTemplate(source="gguf", template=evil)))  # type: ignore[arg-type]
    assert not marker.exists()
    # A template that only rejects some conversations fails those requests, not the job.
    picky = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system message first') }}{% endif %}"
    batchjob.check_template(LoadedModel("m", None, ChatTemplate(source="gguf", template=picky)))  # type: ignore[arg-type]
    batchjob.check_template(LoadedModel("m", None, None))  # type: ignore[arg-type]


# -- the command without a model ------------------------------------------------------------------------


def _app():
    from localinfer.cli.main import build_app

    return build_app()


def test_help_lists_batch_and_its_options():
    runner = CliRunner()
    assert "batch" in runner.invoke(_app(), ["--help"]).output
    result = runner.invoke(_app(), ["batch", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for flag in ("--parallel", "--resume", "--on-error", "--output", "--keep-order", "--max-tokens", "--temperature"):
        assert flag in result.output


@pytest.mark.llama
def test_usage_errors_exit_2_before_loading(tmp_path):
    runner = CliRunner()
    reqs = tmp_path / "r.jsonl"
    reqs.write_text('{"id": "x", "prompt": "a"}\n{"id": "y", "prompt": "b"}\n{"id": "x", "prompt": "c"}\n')
    out = tmp_path / "out.jsonl"
    result = runner.invoke(_app(), ["batch", str(reqs), "-o", str(out), "-m", "no-such-model"])
    assert result.exit_code == 2, result.output
    assert "duplicate ids" in result.output and "'x' (lines 1 and 3)" in result.output
    assert not out.exists()
    result = runner.invoke(_app(), ["batch", str(reqs), "--resume"])
    assert result.exit_code == 2 and "--resume needs --output" in result.output
    result = runner.invoke(_app(), ["batch", str(tmp_path / "nope.jsonl")])
    assert result.exit_code == 2 and "input file not found" in result.output


@pytest.mark.llama
def test_an_output_that_cannot_be_written_fails_before_loading(tmp_path, read_only_dir):
    reqs = tmp_path / "r.txt"
    reqs.write_text("hi\n")
    missing = tmp_path / "no" / "dir"
    cases = [
        (missing / "out.jsonl", f"there is no folder {missing}"),
        (tmp_path, "it is a folder"),
        (read_only_dir / "out.jsonl", f"{read_only_dir} is not writable"),
    ]
    for out, problem in cases:  # an unknown model would be exit 3: these fail before resolving it
        result = CliRunner().invoke(_app(), ["batch", str(reqs), "-o", str(out), "-m", "no-such-model"])
        assert result.exit_code == 2, result.output
        assert result.output == f"Error: cannot write --output {out}: {problem}\n  hint: pass a file in a folder you can write\n"
    with pytest.raises(UsageError, match="cannot write --output .*: No such file or directory"):
        batchio.JsonlSink(path=missing / "out.jsonl")  # what the check cannot foresee (a race) is one line too


@pytest.mark.llama
def test_an_output_in_a_missing_folder_through_the_real_entry_point(tmp_path):
    from conftest import run_cli

    reqs = tmp_path / "r.txt"
    reqs.write_text("hi\n")
    proc = run_cli("batch", str(reqs), "-o", "/nonexistent/dir/out.jsonl", timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and proc.stdout == b"", err
    assert err.startswith("Error: cannot write --output /nonexistent/dir/out.jsonl: there is no folder /nonexistent/dir\n")


@pytest.mark.llama
def test_resume_with_everything_done_needs_no_model(tmp_path):
    reqs = tmp_path / "r.txt"
    reqs.write_text("one\ntwo\n")
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": 1, "text": "1"}\n{"id": 2, "text": "2"}\n')
    result = CliRunner().invoke(_app(), ["batch", str(reqs), "-o", str(out), "--resume", "-m", "no-such-model"])
    assert result.exit_code == 0, result.output
    assert "2 requests (2 already in the output) · 0 answered" in result.output
    assert out.read_text() == '{"id": 1, "text": "1"}\n{"id": 2, "text": "2"}\n'


def test_output_order_holds_a_record_until_those_before_it_are_out():
    from localinfer.batch.io import OutputOrder

    ordered = OutputOrder(keep_order=True)
    assert [ordered.release(i, r) for i, r in [(2, "c"), (0, "a"), (3, "d"), (1, "b")]] == [[], ["a"], [], ["b", "c", "d"]]
    as_done = OutputOrder(keep_order=False)
    assert [as_done.release(i, r) for i, r in [(2, "c"), (0, "a")]] == [["c"], ["a"]]
