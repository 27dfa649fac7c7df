"""The head start of `run`: the weights load while Typer parses, and are used only when they match."""

from __future__ import annotations

import os
import re
import time

import pytest
from conftest import amx_twin_here, needs_amx_twin, run_cli, run_python

from localinfer.cli.prescan import FLAGS, NO_HEAD_START, VALUE_OPTIONS, max_tokens, scan


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
    values = scan(args)  # None: no head start
    assert (values is not None, values.get("--model") if values is not None else None) == expected


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], None),
        (["-n", "64", "-p", "x"], 64),
        (["--max-tokens=8"], 8),
        (["-n", "5", "--max-tokens", "40"], 40),  # the last one wins
        (["-n", "many"], None),  # Typer will refuse it; no cap as far as the head start goes
        (["-n", "\u00b2"], None),  # a digit, but not a number int() takes
    ],
)
def test_prescan_reads_the_answers_cap(args, expected):
    values = scan(args)
    assert values is not None and max_tokens(values) == expected


def test_the_decoding_twin_starts_ahead_only_when_the_answer_may_be_long(smollm2_path, monkeypatch):
    from localinfer import preload
    from localinfer.engine import llama as engine
    from localinfer.engine import twin as twin_mod

    for cap, expect_twin in ((8, False), (None, amx_twin_here())):
        monkeypatch.setattr(preload, "_started", [])
        preload.start(str(smollm2_path), max_tokens=cap)
        pre = engine._preloaded[0]
        try:
            assert (pre.twin is not None) == expect_twin
            if pre.twin is not None:  # loaded without the tokenizer: the header told its size
                assert pre.twin._overrides is not None and pre.twin._overrides[1].value.val_i64 == 49152
        finally:
            pre.take(None)  # frees the weights (no Model asked for these)
            pre.take_twin(taken=False)
            engine._preloaded.clear()
            twin_mod.settle()
    assert not twin_mod._loading


@needs_amx_twin
def test_the_model_takes_the_twin_loaded_ahead_without_its_log_lines(smollm2_path):
    from localinfer.engine import llama as engine
    from localinfer.engine.types import GenerationStats, LoadOptions, SamplingOptions
    from localinfer.hardware import memory_budget

    assert engine.preload_model(smollm2_path, twin_budget=memory_budget())
    ahead = engine._preloaded[0].twin
    assert ahead is not None
    model = engine.Model(smollm2_path, LoadOptions(n_ctx=256, n_threads=2))
    try:
        assert model._twin is ahead and ahead.weights_loaded.wait(60)
        # Its context is created only once the first token is out: nothing of the twin may run while
        # the prompt is evaluated (engine.twin).
        time.sleep(0.2)
        assert ahead.ctx is None and not ahead.failed
        # Both loads ran at once; the report is this load's alone (the twin's "AMX model buffer" and
        # its second KV cache would be counted as this model's memory).
        assert not any("AMX" in line for line in model.memory_log)
        assert sum("KV buffer size" in line for line in model.memory_log) == 1
        stats = GenerationStats()
        text = "".join(s.text for s in model.generate(model.tokenize("Once upon a time"), SamplingOptions(temperature=0), stats, max_tokens=40, ignore_eos=True))
        assert text and stats.completion_tokens == 40 and model.decodes_on_twin and model._twin is ahead
        assert ahead.ctx is not None  # created after the first token, with the model's settings
    finally:
        model.close()


@needs_amx_twin
def test_a_twin_loaded_ahead_that_the_model_does_not_want_is_stopped(smollm2_path):
    from localinfer.engine import llama as engine
    from localinfer.engine import twin as twin_mod
    from localinfer.engine.types import LoadOptions
    from localinfer.hardware import memory_budget

    assert engine.preload_model(smollm2_path, twin_budget=memory_budget())
    ahead = engine._preloaded[0].twin
    model = engine.Model(smollm2_path, LoadOptions(n_ctx=256, n_threads=2, n_seq_max=2))  # batches: no twin
    try:
        assert engine._preloaded == [] and model._twin is None
        twin_mod.settle()
        assert ahead.failed and ahead.model is None and not twin_mod._loading
    finally:
        model.close()


def test_memory_measured_before_the_loads_ahead_counts_only_when_their_twin_is_taken(smollm2_path, monkeypatch):
    # With the weights loaded ahead not taken (other parameters), the model loads its own: the twin's
    # memory check must see memory as it is now, not as it was before any load.
    from localinfer.engine import llama as engine
    from localinfer.engine import twin as twin_mod
    from localinfer.engine.types import LoadOptions
    from localinfer.hardware import memory_budget

    budgets = []
    real = twin_mod.wanted

    def spy(*args):
        budgets.append(args[4])
        return real(*args)

    monkeypatch.setattr(twin_mod, "wanted", spy)
    assert engine.preload_model(smollm2_path, twin_budget=memory_budget())
    model = engine.Model(smollm2_path, LoadOptions(n_ctx=256, n_threads=2, use_mmap=False))
    try:
        assert budgets == [None] and model._twin is None
    finally:
        model.close()
        twin_mod.settle()


def test_ctrl_c_before_typer_takes_over_stops_the_loads_ahead_quietly(smollm2_path, monkeypatch):
    # The head start runs while Typer is imported: a Ctrl-C then must cancel the AMX twin's load
    # (not wait for all of it at exit) and end with 130, not a traceback.
    import localinfer.cli.main as cli_main
    from localinfer import preload
    from localinfer.engine import llama as engine
    from localinfer.engine import twin as twin_mod

    started = []

    def interrupted(*_only):
        if engine._preloaded and engine._preloaded[0].twin is not None:
            started.append(engine._preloaded[0].twin)
        raise KeyboardInterrupt

    monkeypatch.setattr(preload, "_started", [])
    monkeypatch.setattr(cli_main, "build_app", interrupted)
    monkeypatch.setattr("sys.argv", ["localinfer", "run", "-m", str(smollm2_path), "-p", "hi"])
    with pytest.raises(SystemExit) as exit_info:
        cli_main.main()
    assert exit_info.value.code == 130
    assert not twin_mod._loading
    assert all(twin._cancelled for twin in started)
    engine._preloaded.clear()
    if amx_twin_here():
        assert started  # the twin had started ahead, and was stopped


def test_a_process_that_only_started_loading_ahead_still_exits(smollm2_path):
    # The twin's weights load, then it waits for a context's settings that nobody will send: the
    # interpreter ending must stop it (it is not a daemon thread: it must not be killed mid-load).
    code = (
        "import sys\n"
        "from localinfer.engine import llama as engine\n"
        "from localinfer.hardware import memory_budget\n"
        "assert engine.preload_model(sys.argv[1], twin_budget=memory_budget())\n"
        "pre = engine._preloaded[0]\n"
        "pre.thread.join()\n"
        "print('twin' if pre.twin is not None else 'none')\n"
    )
    proc = run_python(code, str(smollm2_path), timeout=60)
    assert proc.stdout.strip() == ("twin" if amx_twin_here() else "none")


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


def test_weights_loaded_ahead_are_taken_when_the_file_is_named_another_way(smollm2_path, monkeypatch):
    # A hint notes the absolute path; `run -m ./model.gguf` resolves to a relative one: the same file.
    from localinfer.engine import llama as engine
    from localinfer.engine.types import LoadOptions

    assert engine.preload_model(smollm2_path.resolve())
    engine._preloaded[0].thread.join()

    def second_load(*_args):
        raise AssertionError("the weights were loaded again")

    monkeypatch.setattr(engine.llama_cpp, "llama_model_load_from_file", second_load)
    monkeypatch.chdir(smollm2_path.parent)
    model = engine.Model(f"./{smollm2_path.name}", LoadOptions(n_ctx=256, n_threads=2))
    try:
        assert not engine._preloaded and model.tokenize("Paris")
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


# -- hints: the next run's load starts before resolving ------------------------------------------------


def _resolution(path, split_count=None):
    from types import SimpleNamespace

    info = SimpleNamespace(split_count=split_count, architecture="llama", vocab_size=100)
    return SimpleNamespace(path=path, info=info)


def test_a_hint_holds_only_while_its_file_is_the_one_verified(tmp_path, isolated_home):
    import json
    import os
    import sys

    from localinfer import preload
    from localinfer.paths import file_identity

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    preload.remember("some:model", _resolution(model))
    assert preload._hint("some:model") == (str(model), 64, ("llama", 100))
    assert preload._hint(None) is None and preload._hint("other:model") is None
    st = os.stat(model)
    if sys.platform != "win32":  # there, st_ctime is the creation time
        os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same times back: its ctime moved on
        assert preload._hint("some:model") is None
        preload.remember("some:model", _resolution(model))
        assert preload._hint("some:model") is not None
    before = file_identity(model)
    model.write_bytes(b"GGUF" + bytes(59) + b"x")  # the same size, other bytes
    if file_identity(model) != before:  # (a file system with coarse times may not tell, as for the store)
        assert preload._hint("some:model") is None
    preload.remember("some:model", _resolution(model))
    assert preload._hint("some:model") is not None
    hints = preload._read_hints()
    hints["spec:some:model"]["boot"] = "another boot"  # written before the machine restarted
    (isolated_home / preload.HINTS_FILE).write_text(json.dumps(hints))
    assert preload._hint("some:model") is None
    model.unlink()
    assert preload._hint("some:model") is None


def test_a_path_is_noted_from_where_it_was_given_and_a_model_in_several_files_not_at_all(tmp_path, monkeypatch):
    from localinfer import preload

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    monkeypatch.chdir(tmp_path)
    preload.remember("./m.gguf", _resolution(model))
    assert preload._hint(str(model)) == preload._hint("m.gguf") == (str(model), 64, ("llama", 100))
    monkeypatch.chdir(tmp_path.parent)
    assert preload._hint("./m.gguf") is None  # another file, from here
    preload.remember("split:model", _resolution(model, split_count=2))  # only its first file would be checked
    assert preload._hint("split:model") is None and set(preload._read_hints()) == {f"path:{model}"}


def test_a_run_remembers_its_model_and_the_next_loads_it_ahead_before_resolving(smollm2_path, isolated_home):
    import json

    from localinfer import preload

    proc = run_cli("run", "-m", "smollm2:135m", "-p", "hi", "-n", "2", "-q", "--no-log")
    assert proc.returncode == 0, proc.stderr.decode()
    hints = json.loads((isolated_home / preload.HINTS_FILE).read_text())
    assert hints["spec:smollm2:135m"]["path"] == str(smollm2_path)
    code = (
        "import sys\n"
        "from localinfer import preload\n"
        "from localinfer.engine import llama as engine\n"
        "preload.start('smollm2:135m', 8)\n"
        "assert preload._started and preload._started[0][1] is None  # no resolution: from the hint\n"
        "assert 'localinfer.store.resolve' not in sys.modules\n"
        "pre = engine._preloaded[0]\n"
        "pre.take(None)  # waits for the load (its stdout is stderr meanwhile), frees it\n"
        "print(pre.key[0])\n"
    )
    assert run_python(code, timeout=120).stdout.strip() == os.path.realpath(smollm2_path)


def test_a_hint_to_another_file_is_loaded_ahead_in_vain_then_corrected(smollm2_path, gemma_path, isolated_home):
    # The registry's default moved on (or the name was pulled again): the hint still names a good
    # file. The load ahead is of that file; the model loads the one resolved; the hint is corrected.
    import json

    from localinfer import preload
    from localinfer.paths import boot_id, file_identity

    note = {"path": str(gemma_path), "identity": list(file_identity(gemma_path)), "boot": boot_id(),
            "architecture": "gemma3", "vocab_size": 262144}  # fmt: skip
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / preload.HINTS_FILE).write_text(json.dumps({"spec:smollm2:135m": note}))
    args = ["run", "-m", "smollm2:135m", "-p", "The capital of France is", "--raw", "-n", "8", "--temperature", "0",
            "-c", "256", "-q", "--no-log", "--json"]  # fmt: skip
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr.decode()
    answer = json.loads(proc.stdout)
    assert answer["model"] == "smollm2:135m" and answer["text"]
    assert json.loads((isolated_home / preload.HINTS_FILE).read_text())["spec:smollm2:135m"]["path"] == str(smollm2_path)
    again = run_cli(*args)  # from the corrected hint now: the same answer
    assert again.returncode == 0, again.stderr.decode()
    assert json.loads(again.stdout)["text"] == answer["text"]


def test_only_the_most_recently_resolved_names_are_noted(tmp_path):
    from localinfer import preload

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    for i in range(preload.MAX_HINTS + 5):
        preload.remember(f"model:{i}", _resolution(model))
    preload.remember("model:3", _resolution(model))  # resolved again: the newest now
    kept = list(preload._read_hints())
    assert len(kept) == preload.MAX_HINTS and kept[-1] == "spec:model:3"
    assert "spec:model:0" not in kept and "spec:model:5" not in kept and "spec:model:6" in kept


def test_weights_loaded_ahead_from_a_file_replaced_since_are_not_taken(smollm2_path, gemma_path, tmp_path):
    # A load ahead from a hint begins before resolving, which may rewrite the file at that path (a
    # repair, a new pull): the model must not take weights read from the file that was there before.
    import os

    from localinfer.engine import llama as engine
    from localinfer.engine.types import LoadOptions

    model = tmp_path / "m.gguf"
    os.symlink(smollm2_path, model)
    assert engine.preload_model(model)
    engine._preloaded[0].thread.join()
    os.symlink(gemma_path, tmp_path / "new.gguf")
    os.replace(tmp_path / "new.gguf", model)
    loaded = engine.Model(model, LoadOptions(n_ctx=256, n_threads=2))
    try:
        assert loaded.n_vocab == 262144 and loaded.vocab_shape[0] == "gemma3" and not engine._preloaded
    finally:
        loaded.close()
