"""The suite's own `llama` marker (tests/conftest.py): set by the real models' fixtures, and a test
that used llama.cpp without it fails, whether in process, in a child or through a shared fixture -
CI's second build (.ci/rpc) runs only the marked tests, so a missed mark would go untested there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

INNER = '''
import subprocess, sys
import pytest

@pytest.fixture(scope="module")
def shared():
    from localinfer.engine import backend
    backend.ensure_backend(None)  # as a module's shared model loads once
    return backend

def test_plain():
    pass

def test_in_process_unmarked():
    from localinfer.engine import backend
    backend.system_info()

@pytest.mark.llama
def test_in_process_marked():
    from localinfer.engine import backend
    backend.system_info()

def test_child_unmarked():
    subprocess.run([sys.executable, "-c", "import localinfer.engine.backend"], check=True)

@pytest.mark.llama
def test_fixture_first_marked(shared):
    pass

def test_fixture_again_unmarked(shared):
    pass

def test_a_real_model_is_marked_llama_and_slow(request, smollm2_path):
    assert request.node.get_closest_marker("llama") and request.node.get_closest_marker("slow")
'''


@pytest.mark.slow
def test_a_test_that_uses_llama_cpp_unmarked_fails_at_teardown(pytester, monkeypatch):
    monkeypatch.delenv("LOCALINFER_TEST_LLAMA_LOG", raising=False)  # the inner run keeps its own
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    pytester.makeconftest((TESTS / "conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    outcomes = result.parseoutcomes()
    if outcomes.get("skipped"):  # no smollm2 package: the rest still holds
        assert outcomes["skipped"] == 1
    assert outcomes.get("errors") == 3, result.stdout.str()
    errors = {line.split("::")[1].split(" ")[0] for line in result.stdout.lines if line.startswith("ERROR test_inner.py::")}
    assert errors == {"test_in_process_unmarked", "test_child_unmarked", "test_fixture_again_unmarked"}
    result.stdout.fnmatch_lines(["*test_fixture_again_unmarked used llama.cpp (through shared)*"])
