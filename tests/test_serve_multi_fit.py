"""serve without -m, on fakes: a load that cannot happen (a context beyond the trained one, a model
that would not fit even alone) is refused before any other model is unloaded, in each wire's shape."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from test_serve import HI, call
from test_serve_multi_logic import Engine, _engine_for, served

from localinfer.errors import ResourceError
from localinfer.serve.http.app import ServerState
from localinfer.serve.config import ServeConfig
from localinfer.serve.models.multi import LoadedEngine
from localinfer.serve.wires.openai import ApiError


def _loaded(monkeypatch: pytest.MonkeyPatch, **kw: Any) -> tuple[Any, list[str], list[Engine]]:
    """A Served with ``smol`` (trained on 2048) loaded and idle; the names each load was for."""
    made: list[str] = []
    engines: list[Engine] = []

    def make(resolved: Any, name: str, want: Any) -> Any:
        made.append(name)
        engines.append(Engine(pieces=(name,)))
        return LoadedEngine(name, engines[-1])

    s = served(monkeypatch, make, **kw)
    _engine_for(s, "smol")
    for router, slot in list(s.router.slots.items()):
        slot.info.busy = 0  # the lease ended
    return s, made, engines


def test_num_ctx_beyond_the_trained_context_is_a_400_that_unloads_nothing(monkeypatch):
    s, made, engines = _loaded(monkeypatch)
    with pytest.raises(ApiError) as err:
        _engine_for(s, "smol", num_ctx=100_000_000)
    assert err.value.status == 400 and err.value.param == "num_ctx"
    assert err.value.message == "'options.num_ctx' 100000000 is beyond the 2048 tokens smol was trained on: ask for 2048 or less"
    assert made == ["smol"] and not engines[0].stopped and list(s.router.slots) == ["/models/smol.gguf"]
    state = ServerState(ServeConfig(), s)
    body = {"prompt": "x", "model": "smol", "stream": False, "options": {"num_ctx": 100_000_000}}
    status, _, data = call(state, "POST", "/api/generate", body)
    assert status == 400 and "beyond the 2048 tokens" in json.loads(data)["error"]  # Ollama's shape
    assert made == ["smol"] and not engines[0].stopped
    _, found, _ = _engine_for(s, "smol", num_ctx=2048)  # up to the trained context: reloaded
    assert found == "smol" and made == ["smol", "smol"] and engines[0].stopped


def test_a_ctx_size_beyond_a_model_s_trained_context_is_a_400_naming_it_and_force(monkeypatch):
    s = served(monkeypatch, ctx_size=32768)
    state = ServerState(ServeConfig(), s)
    status, _, data = call(state, "POST", "/v1/chat/completions", {"messages": HI, "model": "smol"})
    message = json.loads(data)["error"]["message"]
    assert status == 400 and "--ctx-size 32768" in message and "2048" in message and "--force" in message
    status, _, data = call(state, "POST", "/v1/messages", {"messages": HI, "model": "gemma", "max_tokens": 4})
    assert status == 400 and json.loads(data)["type"] == "error"  # Anthropic's shape
    assert not s.router.slots
    forced = served(monkeypatch, ctx_size=32768, force=True)  # --force: beyond it, as the pre-flight allows
    assert _engine_for(forced, "smol")[1] == "smol"


def test_a_model_that_would_not_fit_even_alone_is_refused_before_unloading_the_others(monkeypatch):
    from localinfer.engine.types import LoadOptions
    from localinfer.system import hardware, preflight
    from localinfer.system.buffers import BufferReport

    s, made, engines = _loaded(monkeypatch)
    s.base = LoadOptions()
    engines[0].loaded = SimpleNamespace(template=None, buffers=BufferReport((("model", "CPU", 500),), None, None))
    budgets: list[Any] = []

    def plan_load(info: Any, options: Any, *, budget: Any, name: str, **_: Any) -> Any:
        budgets.append(budget)
        raise ResourceError(f"not enough memory for {name}: it needs about 9 GB, and {budget.ram_available} B is available")

    monkeypatch.setattr(hardware, "memory_budget", lambda: hardware.MemoryBudget(ram_available=1000, ram_total=4000))
    monkeypatch.setattr(preflight, "plan_load", plan_load)
    with pytest.raises(ApiError) as err:
        _engine_for(s, "gemma")
    assert err.value.status == 507 and "1500 B is available" in err.value.message  # with what smol gives back
    assert made == ["smol"] and not engines[0].stopped and len(s.router.slots) == 1
    with pytest.raises(ApiError) as err:
        _engine_for(s, "smol", num_ctx=2048)  # a reload that would not fit: smol stays loaded
    assert err.value.status == 507 and made == ["smol"] and not engines[0].stopped


def test_the_start_names_the_models_trained_on_less_than_ctx_size(monkeypatch):
    from localinfer.serve.models import fit
    from localinfer.serve.wires.ollama import models as om
    facts = [om.ListedModel("smol", 1, "", "", context_length=8192), om.ListedModel("big", 1, "", "", context_length=131072),
             om.ListedModel("other", 1, "", "", context_length=2048)]  # fmt: skip
    monkeypatch.setattr(om, "catalog", lambda loaded, names: facts)
    warning = fit.start_warning(32768, ["smol", "big"], force=False)
    assert warning == ("--ctx-size 32768 is beyond the tokens these were trained on: smol (8192); "
                       "requests for them are refused (400) unless --force")  # fmt: skip
    assert "answers may degrade" in fit.start_warning(32768, ["smol"], force=True)  # type: ignore[operator]
    assert fit.start_warning(8192, ["smol", "big"], force=False) is None and fit.start_warning(None, ["smol"], force=False) is None


def test_force_s_help_says_it_also_goes_beyond_the_trained_context():
    from localinfer.cli.options import ForceOpt

    assert "trained" in ForceOpt.__metadata__[0].help




def test_two_names_of_two_copies_of_one_file_share_one_load(monkeypatch, tmp_path):
    """`smol` pulled from the shipped SmolLM2 is a copy of the file `smollm2:135m` names: one digest,
    one load (the digest a client picks answers whichever name it lists)."""
    import localinfer.store

    for name in ("shipped.gguf", "blob", "other"):
        (tmp_path / name).write_bytes(b"GGUF")
    files = {"smollm2:135m": ("shipped.gguf", "ab" * 32), "smol": ("blob", "ab" * 32), "gemma": ("other", "cd" * 32)}
    made: list[str] = []

    def make(resolved: Any, name: str, want: Any) -> Any:
        made.append(name)
        return LoadedEngine(name, Engine(pieces=(name,)))

    s = served(monkeypatch, make)
    monkeypatch.setattr(s, "servable", lambda: sorted(files))
    monkeypatch.setattr(localinfer.store, "resolve_model", lambda name, **_: SimpleNamespace(
        name=name, path=tmp_path / files[name][0], sha256=files[name][1], info=SimpleNamespace(context_length=2048),
        mmproj=None, chat_format=None))  # fmt: skip
    for name in ("smol", "smollm2:135m", "smol", "gemma"):
        assert _engine_for(s, name)[1] == name
    assert made == ["smol", "gemma"] and len(s.router.slots) == 2
    assert set(s.loaded()) == {"smol", "smollm2:135m", "gemma"} and sorted(s.loaded(aliases=False)) == ["gemma", "smol"]
