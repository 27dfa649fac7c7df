"""Shared fixtures: every test gets its own localinfer home and HF cache; nothing touches the real ones.

Also the ``llama`` marker: a test that uses llama.cpp (a real model's fixture, or marked by hand) is
marked, and ``slow`` with it; CI's second pass (.ci/rpc, another build of llama.cpp) runs only those.
A test that used llama.cpp unmarked fails at teardown, so the split cannot rot: each use is noted in
the file LOCALINFER_TEST_LLAMA_LOG names, in this process and in its children, by an import hook that
wraps the engine's entries to llama.cpp (tests/llama_witness/sitecustomize.py: the package knows
nothing of it).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# llama.cpp's threads wait for each other at every barrier of a decode (OpenMP's, in this build); by
# default they spin there, and on a loaded 2-core machine a descheduled partner makes the other spin
# its whole time slice: a 32-token `run` took 45-84 s instead of 10 s (benchmarks/results/
# test-threads-2026-12-04.txt). Passive waiting changes no output, only who gets the CPU. Set before
# any test module loads libllama (and inherited by every child the tests start).
os.environ.setdefault("OMP_WAIT_POLICY", "passive")



def _install_witness() -> None:
    """The witness of llama.cpp's use, here and (as their ``sitecustomize``, by PYTHONPATH) in every
    Python child the tests start. A child pytest (tests/test_suite_markers.py's) has it already."""
    if any(getattr(f, "llama_witness", False) for f in sys.meta_path):
        return
    folder = Path(__file__).resolve().parent / "llama_witness"
    spec = importlib.util.spec_from_file_location("llama_witness", folder / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)


_install_witness()

# fake_backend and fake_engine for every file; pytester for tests/test_suite_markers.py
pytest_plugins = ["fakebackend", "fakeengine", "pytester"]

# A test that asks for one of these (directly or through another fixture) runs a real model, unless a
# fake stands in for it (then the model is only a file the command resolves).
LLAMA_FIXTURES = frozenset({"smollm2_path", "gemma_path"})
FAKE_FIXTURES = frozenset({"fake_engine", "fake_backend"})
_LLAMA_LOG = "LOCALINFER_TEST_LLAMA_LOG"
_LOG_SIZE = pytest.StashKey[int]()
_llama_fixtures: set[str] = set()  # fixtures seen using llama.cpp as they were set up (a shared model, a server)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    # The whole suite (no paths given: README's command, CI) on two xdist workers, a file per worker so
    # module-scoped models and servers load once: tests spend much of their time waiting on a child or
    # a server, and in one process the second core was mostly idle (0.71-0.74x the wall on two workers:
    # benchmarks/results/suite-xdist-2026-12-04.txt). Runs of chosen files stay in one process (-s,
    # --pdb as usual); `-n N` given wins, `-n 0` turns it off.
    if (
        config.args_source == pytest.Config.ArgsSource.TESTPATHS
        and config.pluginmanager.has_plugin("xdist")
        and config.option.numprocesses is None
        and not os.environ.get("PYTEST_XDIST_WORKER")
        and not (config.option.collectonly or config.option.usepdb)
        and (os.cpu_count() or 1) >= 2
    ):
        config.option.numprocesses, config.option.dist = 2, "loadfile"


def pytest_configure(config: pytest.Config) -> None:
    # an xdist worker (`-n 2`) keeps its own witness: one shared file would blame a test on one worker
    # for a use on the other
    if not os.environ.get(_LLAMA_LOG) or hasattr(config, "workerinput"):
        fd, path = tempfile.mkstemp(prefix="localinfer-llama-uses-")
        os.close(fd)
        os.environ[_LLAMA_LOG] = path  # inherited by every child the tests start
        config.add_cleanup(lambda: Path(path).unlink(missing_ok=True))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(item.fixturenames)
        if names & LLAMA_FIXTURES and not names & FAKE_FIXTURES and not item.get_closest_marker("llama"):
            item.add_marker(pytest.mark.llama)
        if item.get_closest_marker("llama") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


def _llama_uses() -> int:
    try:
        return os.path.getsize(os.environ[_LLAMA_LOG])
    except (KeyError, OSError):
        return 0


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    # a fixture that loads a model once for a module: the tests after the first use it without a new load
    # (function-scoped ones are caught by the test's own count)
    before = _llama_uses()
    result = yield
    if fixturedef.scope != "function" and _llama_uses() > before:
        _llama_fixtures.add(fixturedef.argname)
    return result


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_LOG_SIZE] = _llama_uses()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    result = yield
    if item.get_closest_marker("llama") or item.get_closest_marker("gpu"):  # .ci/rpc runs both marks
        return result
    used = _llama_fixtures.intersection(item.fixturenames)
    if used or _llama_uses() > item.stash.get(_LOG_SIZE, 0):
        pytest.fail(
            f"{item.nodeid} used llama.cpp ({'through ' + ', '.join(sorted(used)) if used else 'in this process or a child'}) "
            "but is not marked llama: ask for a real model's fixture (smollm2_path, gemma_path) or mark it "
            "@pytest.mark.llama, or CI's second build (.ci/rpc) skips it",
            pytrace=False,
        )
    return result


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    home = tmp_path / "localinfer-home"
    monkeypatch.setenv("LOCALINFER_HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("LOCALINFER_DEBUG", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("LOCALINFER_ENDPOINT", raising=False)  # would send every command to a server
    return home


def run_cli(
    *args: str, input: str | bytes | None = None, env: dict | None = None, timeout: float = 300, **kw
) -> subprocess.CompletedProcess:
    """The real entry point, in a subprocess: `python -m localinfer ARGS` (stdin closed unless given)."""
    full_env = {**os.environ, **(env or {})}
    if isinstance(input, str):
        input = input.encode()
    return subprocess.run(
        [sys.executable, "-m", "localinfer", *args],
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,
        capture_output=True,
        env=full_env,
        timeout=timeout,
        **kw,
    )


def run_python(code: str, *args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """``python -c CODE ARGS`` in a subprocess, text out; it must exit 0 (its stderr says why not)."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture
def unprobed(monkeypatch):
    """No test load in a child process (store.loadable): for tests of the store's own mechanics on
    synthetic GGUFs that llama.cpp cannot load (the probe has its tests in test_loadable.py)."""
    monkeypatch.setenv("LOCALINFER_PROBE", "0")


@pytest.fixture(scope="session")
def smollm2_path():
    from models import smollm2_path as locate

    return locate()


@pytest.fixture(scope="session")
def gemma_path(tmp_path_factory):
    from models import gemma_path as locate

    return locate(tmp_path_factory)


@pytest.fixture(scope="session")
def shared_home(tmp_path_factory):
    """A localinfer home shared by the subprocess tests of one session (so gemma is assembled once)."""
    return tmp_path_factory.mktemp("shared-home")


@pytest.fixture
def read_only_dir(tmp_path, monkeypatch):
    """A folder this process may not write, for in-process tests (CliRunner): mode 0o555 and, as root
    (whom modes do not stop, and tests here run as root), os.access answering as for anyone else."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    if getattr(os, "geteuid", lambda: -1)() == 0:
        real_access = os.access

        def access(path, mode, *args, **kw):
            inside = os.path.abspath(path) == str(folder) or os.path.abspath(path).startswith(str(folder) + os.sep)
            return False if inside and mode & os.W_OK else real_access(path, mode, *args, **kw)

        monkeypatch.setattr(os, "access", access)
    yield folder
    folder.chmod(0o755)  # so that pytest can remove it
