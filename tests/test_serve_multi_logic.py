"""serve without -m, on fakes (no llama.cpp): names are looked up among installed models only (never a
path), each protocol's refusal names the closest installed model, the router's refusals become 503
and 507, and a request's model picks the engine that answers it and holds it for the exchange."""

from __future__ import annotations

import functools
import json
import time
from types import SimpleNamespace
from typing import Any

import pytest
from test_serve import HI, FakeEngine, call

from localinfer.errors import ResourceError
from localinfer.serve.models import listings
from localinfer.serve.http.app import ServerState
from localinfer.serve.config import ServeConfig
from localinfer.serve.models.multi import LoadedEngine, Served, is_path
from localinfer.serve.wires.openai import ApiError


class Engine(FakeEngine):
    stopped = False
    loaded = SimpleNamespace(template=None)  # no chat template: Ollama's generate sends the prompt as it is

    def stop(self) -> None:
        self.stopped = True


def served(monkeypatch: pytest.MonkeyPatch, make: Any = None, **kw: Any) -> Served:
    """A Served over two installed models whose files are never opened; ``make``: the loader."""
    s = Served(ServeConfig(max_queue=kw.pop("max_queue", 4)), SimpleNamespace(n_gpu_layers=0), **kw)  # type: ignore[arg-type]
    opened: list[str] = []
    s.opened = opened  # type: ignore[attr-defined]
    monkeypatch.setattr(s, "servable", lambda: list(s.only) if s.only else ["gemma", "smol"])

    def resolve_model(name: str, **_: Any) -> Any:
        opened.append(name)
        return SimpleNamespace(name=name, path=f"/models/{name}.gguf", info=SimpleNamespace(context_length=2048), mmproj=None)

    import localinfer.store

    monkeypatch.setattr(localinfer.store, "resolve_model", resolve_model)
    monkeypatch.setattr(s, "_default_ctx", lambda resolved, name: 1024)
    monkeypatch.setattr(s, "_make", make or (lambda resolved, name, want: LoadedEngine(name, Engine(pieces=(name,)))))
    return s


@pytest.mark.parametrize("name", ["/etc/passwd", "models/x", "..\\x", "x.gguf", "X.GGUF", "~/m", "./m"])
def test_a_path_is_never_a_name(name):
    assert is_path(name)


@pytest.mark.parametrize("name", ["smol", "gemma:latest", "qwen2.5:0.5b", "gpt-4o"])
def test_names_are_not_paths(name):
    assert not is_path(name)


def test_lookup_takes_installed_names_and_refuses_the_rest_naming_the_closest(monkeypatch):
    s = served(monkeypatch)
    assert s.resolve("gemma:latest")[0] == "gemma" and s.resolve("smol")[0] == "smol"
    with pytest.raises(ApiError) as err:
        s.resolve("gemmma")
    assert err.value.status == 404 and "closest installed: gemma" in err.value.message
    with pytest.raises(ApiError, match="never a file"):
        s.resolve("/models/smol.gguf")
    assert s.opened == ["gemma", "smol"]  # type: ignore[attr-defined]
    only = served(monkeypatch, only=("smol",))
    with pytest.raises(ApiError, match="closest installed: smol"):
        only.resolve("gemma")


def _engine_for(s: Served, name: str, **kw: Any) -> Any:
    import asyncio

    async def main() -> Any:
        scope: dict[str, Any] = {}
        engine, found = await s.engine_for(scope, name, **kw)
        return engine, found, scope

    return asyncio.run(main())


def test_the_pre_flight_refusal_is_a_507_naming_need_and_free(monkeypatch):
    def make(resolved: Any, name: str, want: Any) -> Any:
        raise ResourceError("smol needs 9.0 GB, 2.0 GB free", hint="use a smaller --ctx-size")

    with pytest.raises(ApiError) as err:
        _engine_for(served(monkeypatch, make), "smol")
    assert err.value.status == 507 and "needs 9.0 GB, 2.0 GB free" in err.value.message


def test_per_request_fields_are_checked_and_num_ctx_sizes_the_load(monkeypatch):
    wants: list[Any] = []

    def make(resolved: Any, name: str, want: Any) -> Any:
        wants.append(want)
        return LoadedEngine(name, Engine())

    s = served(monkeypatch, make)
    for bad in ({"keep_alive": "soon"}, {"keep_alive": [1]}, {"num_ctx": 8}, {"num_ctx": "2048"}):
        with pytest.raises(ApiError) as err:
            _engine_for(s, "smol", **bad)
        assert err.value.status == 400
    assert wants == []
    engine, found, scope = _engine_for(s, "smol", num_ctx=2048, keep_alive="10m")  # the most smol was trained on
    assert found == "smol" and wants[0].ctx_per_seq == 2048
    (router, slot), = scope["localinfer.leases"]
    assert slot.info.busy == 1 and slot.info.keep_alive == 600


def test_a_request_s_model_picks_its_engine_on_every_wire_and_is_released(monkeypatch):
    s = served(monkeypatch)
    state = ServerState(ServeConfig(), s)
    status, _, data = call(state, "POST", "/v1/chat/completions", {"messages": HI, "model": "gemma"})
    assert status == 200 and json.loads(data)["model"] == "gemma"
    assert json.loads(data)["choices"][0]["message"]["content"] == "gemma"
    status, _, data = call(state, "POST", "/v1/completions", {"prompt": "x", "model": "smol:latest"})
    assert status == 200 and json.loads(data)["choices"][0]["text"] == "smol"
    status, _, data = call(state, "POST", "/api/generate", {"prompt": "x", "model": "gemma", "stream": False})
    assert status == 200 and json.loads(data)["response"] == "gemma"
    assert all(slot.info.busy == 0 for slot in s.router.slots.values())  # each exchange let go of its model
    status, _, data = call(state, "POST", "/api/chat", {"messages": HI, "model": "gpt-4o"})
    assert status == 404 and "not found" in json.loads(data)["error"]  # Ollama's shape
    status, _, data = call(state, "POST", "/v1/messages", {"messages": HI, "model": "/tmp/x.gguf", "max_tokens": 4})
    assert status == 404 and json.loads(data)["type"] == "error"  # Anthropic's shape
    assert call(state, "GET", "/health")[0] == 200


def test_ollama_s_load_duration_is_the_load_a_request_waited_for(monkeypatch):
    def make(resolved: Any, name: str, want: Any) -> LoadedEngine:
        time.sleep(0.3)
        return LoadedEngine(name, Engine(pieces=(name,)))

    state = ServerState(ServeConfig(), served(monkeypatch, make))
    body = {"prompt": "x", "model": "gemma", "stream": False}
    cold = json.loads(call(state, "POST", "/api/generate", body)[2])
    warm = json.loads(call(state, "POST", "/api/generate", body)[2])
    assert cold["load_duration"] >= 0.3e9 and cold["total_duration"] >= cold["load_duration"]
    assert 0 <= warm["load_duration"] < 0.25e9  # no load to wait for: a lookup (slow only on a loaded machine)


def test_a_full_engine_and_a_full_wait_are_503(monkeypatch):
    s = served(monkeypatch, lambda resolved, name, want: LoadedEngine(name, Engine(full=True)))
    state = ServerState(ServeConfig(), s)
    status, headers, _ = call(state, "POST", "/v1/chat/completions", {"messages": HI, "model": "smol"})
    assert status == 503 and headers["retry-after"] == "1"
    waits = served(monkeypatch, max_queue=0, max_models=1)

    async def main() -> None:
        await waits.engine_for({}, "smol")  # held: the one model that may be loaded is busy
        with pytest.raises(ApiError) as err:
            await waits.engine_for({}, "gemma")
        assert err.value.status == 503 and err.value.headers == {"Retry-After": "1"}

    import asyncio

    asyncio.run(main())


def test_serving_several_models_takes_names_not_files():
    from typer.testing import CliRunner

    from localinfer.cli.main import build_app

    result = CliRunner().invoke(build_app(), ["serve", "-m", "./model.gguf", "-m", "smol", "--port", "0"])
    assert result.exit_code == 2 and "not a file" in result.output, result.output


def test_one_file_under_a_name_with_a_projector_and_one_without_is_reloaded_not_shared(monkeypatch):
    """Two installed names of one file, one pulled with its projector (images in): a request for the
    other is not answered by the model loaded with the projector (it would take images), nor back."""
    import asyncio

    made: list[tuple[str, Any]] = []

    def make(resolved: Any, name: str, want: Any) -> Any:
        made.append((name, want.options["mmproj"]))
        return LoadedEngine(name, Engine(pieces=(name,)))

    s = served(monkeypatch, make)
    monkeypatch.setattr(s, "servable", lambda: ["vis", "plain"])
    import localinfer.store

    def resolve_model(name: str, **_: Any) -> Any:  # one file; "vis" with its projector
        return SimpleNamespace(name=name, path="/models/smol.gguf", info=SimpleNamespace(context_length=2048),
                               mmproj="/models/mmproj.gguf" if name == "vis" else None)  # fmt: skip

    monkeypatch.setattr(localinfer.store, "resolve_model", resolve_model)

    async def main() -> list[str]:
        found = []
        for name in ("vis", "vis", "plain", "vis"):
            scope: dict[str, Any] = {}
            found.append((await s.engine_for(scope, name))[1])
            for router, slot in scope["localinfer.leases"]:
                router.release(slot)
        return found

    assert asyncio.run(main()) == ["vis", "vis", "plain", "vis"]
    assert made == [("vis", "/models/mmproj.gguf"), ("plain", None), ("vis", "/models/mmproj.gguf")]  # the second "vis": the loaded one


def test_a_load_and_a_second_decoding_model_take_their_share_of_the_cpus():
    from localinfer.serve.models.cores import Cores

    class Threads:
        n_threads, n_threads_batch = 4, 4
        calls: list[tuple[int, int]] = []

        def set_threads(self, n: int, nb: int) -> None:
            self.calls.append((n, nb))

    cores, a, b = Cores(cpus=4), Threads(), Threads()
    a.calls, b.calls = [], []
    busy = {"a": True, "b": False}
    keep_a, leave_a = cores.keeper(a, lambda: busy["a"])
    keep_b, leave_b = cores.keeper(b, lambda: busy["b"])
    keep_a()
    assert a.calls == []  # alone, no load: every thread it was loaded with
    with cores.loading():
        keep_a()
        keep_a()
        assert a.calls == [(3, 3)]  # one CPU for the load, set once
    keep_a()
    assert a.calls[-1] == (4, 4)
    busy["b"] = True
    keep_a(), keep_b()
    assert a.calls[-1] == (2, 2) and b.calls == [(2, 2)]  # two decoding: half the CPUs each
    leave_b()
    keep_a()
    assert a.calls[-1] == (4, 4)  # b unloaded: a has them all again
    one = Cores(cpus=1)
    keep, _ = one.keeper(a, lambda: True)
    with one.loading():
        keep()
    assert a.calls[-1] == (1, 1)  # never fewer than one


def test_two_names_of_one_file_share_one_load(monkeypatch, tmp_path):
    real = tmp_path / "model.gguf"
    real.write_bytes(b"GGUF")
    (tmp_path / "link.gguf").symlink_to(real)
    made: list[str] = []

    def make(resolved: Any, name: str, want: Any) -> Any:
        made.append(name)
        return LoadedEngine(name, Engine(pieces=(name,)))

    s = served(monkeypatch, make)
    files = {"smol": tmp_path / "link.gguf", "gemma": real}
    import localinfer.store

    monkeypatch.setattr(localinfer.store, "resolve_model", lambda name, **_: SimpleNamespace(
        name=name, path=files[name], info=SimpleNamespace(context_length=2048), mmproj=None))  # fmt: skip
    for name in ("gemma", "smol", "smol:latest"):
        engine, found, scope = _engine_for(s, name)
        assert found == name.removesuffix(":latest")
    assert made == ["gemma"] and len(s.router.slots) == 1
    assert set(s.loaded()) == {"gemma", "smol"} and list(s.loaded(aliases=False)) == ["gemma"]
    assert [m["status"]["value"] for m in listings.openai_models(s, 0)["data"]] == ["loaded", "loaded"]


def test_the_servable_names_are_read_again_only_when_the_manifest_changed(monkeypatch, tmp_path):
    import os

    import localinfer.store.manifest
    from localinfer.serve.models import installed
    manifest = tmp_path / "manifest.json"
    reads: list[int] = []
    entries: dict[str, Any] = {}

    class Store:
        manifest_path = manifest

        def entries(self) -> dict[str, Any]:
            reads.append(1)
            return entries

    def write(new: dict[str, Any]) -> None:  # as the store writes it: a new file renamed over the old
        entries.clear()
        entries.update(new)
        (tmp_path / "new").write_text(json.dumps(new))
        os.replace(tmp_path / "new", manifest)

    monkeypatch.setattr(localinfer.store.manifest, "Store", Store)
    monkeypatch.setattr(installed, "_default", lambda: {"default"})
    names = installed.Installed()
    write({"smol": {"sha": 1, "last_used": "x"}})
    assert names.names() == ["default", "smol"] and names.names() == ["default", "smol"] and len(reads) == 1
    names.resolved.update(smol="resolved smol", default="resolved default")
    write({"smol": {"sha": 1, "last_used": "y"}, "gemma": {"sha": 2}})  # a pull while serving; smol used
    assert names.names() == ["default", "gemma", "smol"] and len(reads) == 2
    assert names.resolved == {"smol": "resolved smol", "default": "resolved default"}  # its use is no change
    write({"smol": {"sha": 3}, "gemma": {"sha": 2}})  # smol pulled again: another file
    assert names.names() == ["default", "gemma", "smol"] and names.resolved == {"default": "resolved default"}
    write({"gemma": {"sha": 2}})  # smol removed
    assert names.names() == ["default", "gemma"]


def test_the_per_model_figures_add_up_to_the_totals(monkeypatch):
    s = served(monkeypatch)
    engine, _, _ = _engine_for(s, "smol")

    def outcome(prompt: int, completion: int) -> Any:
        stats = SimpleNamespace(prompt_tokens=prompt, cached_tokens=0, completion_tokens=completion, draft_tokens=0,
                                draft_accepted=0, draft_steps=0, decode_s=0.1)  # fmt: skip
        return SimpleNamespace(stats=stats, finish_reason="stop", ttft_s=0.01, total_s=0.2)

    s.metrics.loaded("gemma")
    s.metrics.loaded("smol")
    for model, prompt, completion in (("gemma", 5, 7), ("smol", 11, 13), ("smol", 2, 3)):
        s.metrics.finished(outcome(prompt, completion), model)
    figures = {}
    for line in s.metrics.render(s.gauges(), functools.partial(listings.metrics_text, s)).splitlines():
        if not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            figures[key] = float(value)

    def by_model(metric: str) -> dict[str, float]:
        return {k.split('"')[1]: v for k, v in figures.items() if k.startswith(f"localinfer_model_{metric}{{")}

    assert by_model("prompt_tokens_total") == {"gemma": 5, "smol": 13}
    assert sum(by_model("prompt_tokens_total").values()) == figures["localinfer_prompt_tokens_total"] == 18
    assert sum(by_model("completion_tokens_total").values()) == figures["localinfer_completion_tokens_total"] == 23
    assert sum(by_model("requests_finished_total").values()) == figures['localinfer_requests_finished_total{reason="stop"}'] == 3
    assert by_model("loads_total") == {"gemma": 1, "smol": 1} and by_model("loaded") == {"gemma": 0, "smol": 1}


def test_a_models_default_context_is_sized_once_and_said(monkeypatch):
    # sized by the memory free now: sized again per request, a model's want would move and reload it
    from localinfer.system import preflight

    asked: list[Any] = []

    def serve_context(info: Any, options: Any, parallel: int, reserved: int = 0) -> Any:
        asked.append((info, parallel, reserved))
        return preflight.ServeContext(32768 - 256 * len(asked), "reduced to fit memory")

    monkeypatch.setattr(preflight, "serve_context", serve_context)
    said: list[str] = []
    s = Served(ServeConfig(parallel=3, cache_ram=5 << 20), SimpleNamespace(n_gpu_layers=0), say=said.append)  # type: ignore[arg-type]
    resolved = SimpleNamespace(path="/models/g.gguf", info="g-info")
    assert s._default_ctx(resolved, "g") == s._default_ctx(resolved, "g") == 32512
    assert asked == [("g-info", 3, 5 << 20)], "sized with the prompt cache's memory left out"
    assert said == ["context for g: 32512 tokens per sequence (reduced to fit memory; -c or num_ctx sets it)"]
