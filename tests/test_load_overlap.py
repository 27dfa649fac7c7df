"""The one loader (generate.run.load) compiles the chat template while llama.cpp loads the model:
the jinja2 import and compile are no longer paid after the load, on the way to the first token."""

from __future__ import annotations

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
    from localinfer.generate import run as generate

    seen: dict = {"compiles": []}
    real_init, real_compile = engine_model.Model.__init__, templates.compile_template

    def init(self, *args, **kw):
        seen["load_thread"], seen["load_start"] = threading.current_thread(), time.perf_counter()
        try:
            real_init(self, *args, **kw)
        finally:
            seen["load_end"] = time.perf_counter()

    def compile_template(template):
        seen["compiles"].append((threading.current_thread(), time.perf_counter()))
        return real_compile(template)

    monkeypatch.setattr(engine_model.Model, "__init__", init)
    monkeypatch.setattr(templates, "compile_template", compile_template)
    monkeypatch.setattr(generate, "_spare_cores", lambda: 1)
    templates._compile.cache_clear()
    return seen


def _load(path, watch, **kw):
    from localinfer.engine import templates
    from localinfer.generate.run import load
    from localinfer.store import resolve_model

    resolved = resolve_model(str(path), offline=True)  # a path's first use checks its template: not counted
    watch["compiles"].clear()
    templates._compile.cache_clear()
    return load(resolved, OPTIONS, **kw)


def test_the_template_compiles_on_the_callers_thread_during_the_load(smollm2_path, watch):
    from localinfer.engine import templates

    loaded = _load(smollm2_path, watch)
    try:
        here = threading.current_thread()
        assert watch["load_thread"] is not here  # llama.cpp loads on a thread of its own
        (thread, at), = watch["compiles"]
        assert thread is here and watch["load_start"] <= at <= watch["load_end"]
        misses = templates._compile.cache_info().misses
        prompt = loaded.template.render([{"role": "user", "content": "hi"}])
        assert "<|im_start|>user\nhi<|im_end|>" in prompt.text
        assert templates._compile.cache_info().misses == misses  # the render compiled nothing
    finally:
        loaded.close()


def test_plain_completion_and_a_single_core_load_on_the_callers_thread(smollm2_path, watch, monkeypatch):
    from localinfer.generate import run as generate

    loaded = _load(smollm2_path, watch, chat=False)  # run --raw: no template to prepare
    loaded.close()
    assert watch["load_thread"] is threading.current_thread() and watch["compiles"] == []
    monkeypatch.setattr(generate, "_spare_cores", lambda: 0)  # nothing to overlap with: no thread
    loaded = _load(smollm2_path, watch)
    loaded.close()
    assert watch["load_thread"] is threading.current_thread() and watch["compiles"] == []


def test_a_failed_load_is_raised_here_and_an_interrupt_waits_for_the_load(smollm2_path, watch, monkeypatch):
    from localinfer.engine import model as engine_model
    from localinfer.engine import templates
    from localinfer.errors import InvalidModelError

    def broken(self, *args, **kw):
        raise InvalidModelError("this file is not a model")

    with monkeypatch.context() as m:
        m.setattr(engine_model.Model, "__init__", broken)
        with pytest.raises(InvalidModelError, match="not a model"):
            _load(smollm2_path, watch)

    def interrupted(template):
        raise KeyboardInterrupt

    monkeypatch.setattr(templates, "compile_template", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _load(smollm2_path, watch)
    assert watch["load_end"] >= watch["load_start"]  # the load ran to its end before the interrupt went on
    assert not [t for t in threading.enumerate() if t.name == "localinfer-load"]


@pytest.mark.llama  # the file's first use proves it in a child process
def test_run_has_the_template_prepared_only_where_it_renders_one(smollm2_path, isolated_home, fake_backend):
    from localinfer.cli.main import build_app

    for args, chat in ((["run"], True), (["run", "--raw"], False)):
        fake_backend.enqueue(["ok"])
        res = CliRunner().invoke(build_app(), [*args, "-q", "--no-log", "-m", str(smollm2_path), "-n", "2", "-p", "Hi"])
        assert res.exit_code == 0, res.output
        assert fake_backend.loads[-1]["chat"] is chat
