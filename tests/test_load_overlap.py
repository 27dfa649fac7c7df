"""The one loader (generate.loading.load) compiles the chat template while llama.cpp loads the model:
the jinja2 import and compile are no longer paid after the load, on the way to the first token.
And Ctrl-C during a load stops it (it was dropped inside llama.cpp's log callback)."""

from __future__ import annotations

import collections
import signal
import sys
import threading
import time

import pytest
from typer.testing import CliRunner

from localinfer.engine.types import LoadOptions

pytestmark = pytest.mark.slow

OPTIONS = LoadOptions(n_ctx=256, n_threads=1)


@pytest.fixture
def watch(monkeypatch, isolated_home):
    """Where and when the model loads and the template compiles; a spare core whatever this machine has."""
    from localinfer.engine import model as engine_model
    from localinfer.engine import templates
    from localinfer.system import hardware

    seen: dict = {"compiles": []}
    real_init, real_compile = engine_model.LlamaModel.__init__, templates.compile_template

    def init(self, *args, **kw):
        seen["load_thread"], seen["load_start"] = threading.current_thread(), time.perf_counter()
        try:
            real_init(self, *args, **kw)
        finally:
            seen["load_end"] = time.perf_counter()

    def compile_template(template):
        seen["compiles"].append((threading.current_thread(), time.perf_counter()))
        return real_compile(template)

    monkeypatch.setattr(engine_model.LlamaModel, "__init__", init)
    monkeypatch.setattr(templates, "compile_template", compile_template)
    monkeypatch.setattr(hardware, "available_cpus", lambda: 2)
    templates._compile.cache_clear()
    return seen


def _load(path, watch, **kw):
    from localinfer.engine import templates
    from localinfer.generate.loading import load
    from localinfer.store import resolve_model

    resolved = resolve_model(str(path), offline=True)  # a path's first use checks its template: not counted
    watch["compiles"].clear()
    templates._compile.cache_clear()
    return load(resolved, OPTIONS, **kw)


def test_the_template_compiles_on_a_helper_thread_during_the_load(smollm2_path, watch):
    from localinfer.engine import templates

    loaded = _load(smollm2_path, watch)
    try:
        here = threading.current_thread()
        assert watch["load_thread"] is here  # llama.cpp's allocations stay in this thread's arena
        (thread, at), = watch["compiles"]
        assert thread is not here and watch["load_start"] <= at <= watch["load_end"]
        misses = templates._compile.cache_info().misses
        prompt = loaded.template.render([{"role": "user", "content": "hi"}])
        assert "<|im_start|>user\nhi<|im_end|>" in prompt.text
        assert templates._compile.cache_info().misses == misses  # the render compiled nothing
    finally:
        loaded.close()


def test_plain_completion_and_a_single_core_prepare_nothing_during_the_load(smollm2_path, watch, monkeypatch):
    from localinfer.system import hardware

    _load(smollm2_path, watch, chat=False).close()  # run --raw: no template to prepare
    assert watch["compiles"] == []
    monkeypatch.setattr(hardware, "available_cpus", lambda: 1)  # nothing to overlap with
    _load(smollm2_path, watch).close()
    assert watch["compiles"] == []


def test_a_failed_load_is_raised_and_a_failed_preparation_is_not(smollm2_path, watch, monkeypatch):
    from localinfer.engine import model as engine_model
    from localinfer.engine import templates
    from localinfer.errors import InvalidModelError

    def broken(self, *args, **kw):
        raise InvalidModelError("this file is not a model")

    with monkeypatch.context() as m:
        m.setattr(engine_model.LlamaModel, "__init__", broken)
        with pytest.raises(InvalidModelError, match="not a model"):
            _load(smollm2_path, watch)

    def fails(template):
        raise RuntimeError("the helper's own error")

    monkeypatch.setattr(templates, "compile_template", fails)
    _load(smollm2_path, watch).close()  # the render meets any real error again, in its own words


class _InterruptAt(collections.deque):
    """llama.cpp's log lines, with a Ctrl-C (a real SIGINT) as line ``at`` comes in: mid-load."""

    def __init__(self, at: int) -> None:
        super().__init__(maxlen=400)
        self.at, self.count = at, 0

    def append(self, line: str) -> None:
        super().append(line)
        self.count += 1
        if self.count == self.at:
            signal.raise_signal(signal.SIGINT)


@pytest.mark.parametrize("at", [50, 600, 1500])  # SmolLM2's load logs ~1,100 lines, its context ~1,100 more
def test_ctrl_c_during_a_load_stops_it_and_is_raised(smollm2_path, monkeypatch, at):
    # A signal's handler runs on the main thread at its next bytecode: during a load, inside the
    # log callback, where ctypes printed the KeyboardInterrupt as ignored and the load went on.
    from localinfer.engine import backend
    from localinfer.engine.model import LlamaModel

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    log = backend.ensure_backend(False)
    ignored = []
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    monkeypatch.setattr(log, "lines", _InterruptAt(at))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in the command (xdist may differ)
    try:
        with pytest.raises(KeyboardInterrupt):
            LlamaModel(smollm2_path, OPTIONS)
        lines = "".join(log.lines)
        assert ignored == [] and log.lines.count >= at
        if at < 1000:  # in the model's load: it stops at its first tensor, no context is made
            assert "cancelled model load" in lines and "llama_context" not in lines
        else:  # in the context's creation, which cannot be stopped: raised once it is made (and freed)
            assert "sched_reserve" in lines
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    with LlamaModel(smollm2_path, OPTIONS) as model:  # nothing was left half-done
        assert model.n_ctx >= 256


@pytest.mark.llama  # the file's first use proves it in a child process
def test_run_has_the_template_prepared_only_where_it_renders_one(smollm2_path, isolated_home, fake_backend):
    from localinfer.cli.main import build_app

    for args, chat in ((["run"], True), (["run", "--raw"], False)):
        fake_backend.enqueue(["ok"])
        res = CliRunner().invoke(build_app(), [*args, "-q", "--no-log", "-m", str(smollm2_path), "-n", "2", "-p", "Hi"])
        assert res.exit_code == 0, res.output
        assert fake_backend.loads[-1]["chat"] is chat
