"""CLI logic through Typer's CliRunner (in-process, no model needed)."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from localinfer import __version__
from localinfer.cli.main import build_app

runner = CliRunner()


def test_version_and_help():
    app = build_app()
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.stdout.strip() == f"localinfer {__version__}"
    res = runner.invoke(app, ["run", "--help"])
    assert res.exit_code == 0
    for opt in (
        "--prompt",
        "--system",
        "--temperature",
        "--top-p",
        "--top-k",
        "--min-p",
        "--repeat-penalty",
        "--seed",
        "--max-tokens",
        "--stop",
        "--ctx-size",
        "--threads",
        "--gpu-layers",
        "--raw",
        "--json",
        "--quiet",
        "--verbose",
        "--on-overflow",
    ):
        assert opt in res.stdout, opt


@pytest.mark.llama
def test_usage_errors_exit_2():
    app = build_app()
    res = runner.invoke(app, ["run", "--max-tokens", "0", "-p", "x"])
    assert res.exit_code == 2
    res = runner.invoke(app, ["run", "--on-overflow", "explode", "-p", "x"])
    assert res.exit_code == 2
    res = runner.invoke(app, ["run", "both", "-p", "x"])
    assert res.exit_code == 2 and "not both" in res.output


def test_help_does_not_import_heavy_modules():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from localinfer.cli.main import build_app\n"
        "try:\n    build_app()(['--help'], prog_name='localinfer')\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('llama_cpp', 'huggingface_hub', 'numpy', 'psutil', 'jinja2') if m in sys.modules]\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "HEAVY []" in proc.stderr, proc.stderr


def test_run_builds_only_its_own_command():
    # `localinfer run` is on its way to a first token: the entry point registers no other command
    # (~10 ms); `localinfer --help` lists them without their modules; every other invocation gets them all.
    from conftest import run_python

    code = (
        "import sys\n"
        "from localinfer.cli.main import main\n"
        "sys.argv = ['localinfer', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('OTHERS', sorted(m for m in ('chat', 'pull', 'models', 'batch', 'bench', 'stats', 'doctor')"
        " if f'localinfer.cli.{m}' in sys.modules), file=sys.stderr)\n"
    )
    run_help = run_python(code, "run", "--help")
    assert "Usage: localinfer run" in run_help.stdout and "OTHERS []" in run_help.stderr, run_help.stderr
    top_help = run_python(code, "--help")  # the list of commands imports none of their modules (main._LISTING)
    assert "chat" in top_help.stdout and "OTHERS []" in top_help.stderr, top_help.stderr
    other = run_python(code, "chat", "--help")
    assert "Usage: localinfer chat" in other.stdout
    assert "OTHERS ['batch', 'bench', 'chat', 'doctor', 'models', 'pull', 'stats']" in other.stderr, other.stderr
    only_run = CliRunner().invoke(build_app(only="run"), ["chat"])
    assert only_run.exit_code == 2 and "No such command" in only_run.output


def test_run_in_one_process_keeps_only_its_last_model(smollm2_path):
    # `run` leaves its model to the OS at the process's end (engine.model.LlamaModel.__del__); a process
    # running the command again (CliRunner, a library) must still free the ones before.
    import gc
    import weakref

    import localinfer.cli.run as run_cmd

    args = ["run", "-m", str(smollm2_path), "-p", "hi", "-n", "2", "-c", "256", "-q", "--no-log", "--raw"]
    assert CliRunner().invoke(build_app(), args).exit_code == 0
    first = weakref.ref(run_cmd._until_exit[0])
    assert CliRunner().invoke(build_app(), args).exit_code == 0
    gc.collect()
    assert first() is None and len(run_cmd._until_exit) == 1


def test_help_at_80_and_60_columns_wraps_each_summary_whole():
    # Click cut every command's summary to the width left, with "..." (issue 31).
    import re

    from conftest import run_cli

    app = build_app()
    summaries = {c.name: c.short_help for c in app.registered_commands}
    assert all(summaries.values()) and all("..." not in s for s in summaries.values())
    for columns in (80, 60):
        proc = run_cli("--help", env={"COLUMNS": str(columns)})
        out = proc.stdout.decode()
        assert proc.returncode == 0, out
        listing = out[out.index("Commands:") :]
        assert "..." not in listing and max(map(len, listing.splitlines())) <= columns, listing
        for name, summary in summaries.items():  # every word of every summary, in order
            entry = re.search(rf"^  {name} +(.*?)(?=^  \S|\Z)", listing, re.M | re.S)
            assert entry and " ".join(entry.group(1).split()).replace("- ", "-") == summary, (name, listing)


def test_the_listing_app_prints_the_same_help_as_the_whole_app():
    # `localinfer --help` builds a listing app (its commands take no parameters: Typer would turn ~190
    # options into Click ones just to list the command names). What it prints must not change.
    import os

    from conftest import run_cli, run_python

    env = {**os.environ, "COLUMNS": "80"}
    code = ("import sys; from localinfer.cli.main import build_app; "
            "build_app(listing=sys.argv[1] == 'listing')(['--help'], prog_name='localinfer')")  # fmt: skip
    whole = run_python(code, "whole", env=env).stdout
    assert "Commands:" in whole and "doctor" in whole
    assert run_python(code, "listing", env=env).stdout == whole
    assert run_cli("--help", env={"COLUMNS": "80"}).stdout.decode() == whole  # `localinfer --help` lists
    from typer.main import get_command

    whole_params = sum(len(c.params) for c in get_command(build_app()).commands.values())
    assert whole_params > 150 and all(not c.params for c in get_command(build_app(listing=True)).commands.values())


_ENTRY = (
    "import atexit, sys, threading, time\n"
    "from localinfer.cli.main import entry\n"
    "class Loud:\n"
    "    def __del__(self):\n"
    "        print('torn down', flush=True)\n"
    "keep = Loud()  # a module global: only the interpreter's own teardown deletes it\n"
    "atexit.register(lambda: print('atexit ran'))\n"
    "if sys.argv[1] == 'thread':\n"
    "    threading.Thread(target=lambda: (time.sleep(0.3), print('thread done'))).start()\n"
    "sys.argv = ['localinfer', *sys.argv[2:]]\n"
    "entry()\n"
    "print('not reached')\n"
)


def test_the_entry_point_ends_as_the_interpreter_would_without_the_teardown():
    # `python -m localinfer` and the console script end the process without Python's teardown (its
    # collections cost a run ~10% of its time): the status, atexit handlers and flushed output stay.
    done = subprocess.run([sys.executable, "-c", _ENTRY, "-", "--version"], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, f"localinfer {__version__}\natexit ran\n"), done.stderr
    bad = subprocess.run([sys.executable, "-c", _ENTRY, "-", "nosuch"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == "atexit ran\n" and "no such command" in bad.stderr
    # another thread still running: the interpreter ends it as always (joins it, then tears down)
    waited = subprocess.run([sys.executable, "-c", _ENTRY, "thread", "--version"], capture_output=True, text=True)
    assert waited.returncode == 0 and waited.stdout.splitlines() == [
        f"localinfer {__version__}", "thread done", "atexit ran", "torn down"], waited.stdout


def test_python_dash_m_localinfer_ends_through_the_entry_point(tmp_path):
    # a module global made before the command (sitecustomize) is deleted only by a teardown
    import os

    from conftest import run_cli

    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nclass Loud:\n    def __del__(self):\n        sys.__stderr__.write('torn down')\nkeep = Loud()\n"
    )
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    proc = run_cli("--version", env={"PYTHONPATH": path})
    assert proc.returncode == 0 and proc.stdout == f"localinfer {__version__}\n".encode()
    assert b"torn down" not in proc.stderr
    teardown = subprocess.run([sys.executable, "-c", "import sys"], capture_output=True, env={**os.environ, "PYTHONPATH": path})
    assert b"torn down" in teardown.stderr  # what the check above would see without the entry point
