"""A Hub model's projector is part of it (issue 41): `pull` of a repo that lists ``mmproj-*.gguf`` files
takes the matching one by default, ``--mmproj NAME`` chooses, ``--no-mmproj`` / ``--mmproj none`` skip;
a projector that fails leaves no half model and does not touch an installed one. On the fake Hub
(tests/fakehub.py) with real bytes: projectors tests/projector.py writes, synthetic model GGUFs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fakehub import FakeHub, fake_hub, hub_env  # noqa: F401 - fixtures
from ggufsynth import gguf_bytes
from projector import write_projector
from localinfer.cli.main import build_app

pytestmark = pytest.mark.usefixtures("unprobed")  # synthetic models: the store's mechanics, not llama.cpp's load

VIS = "acme/Vis-GGUF"
TEXT = "acme/Text-GGUF"


def invoke(*args: str):
    return CliRunner().invoke(build_app(), list(args), catch_exceptions=False)


def blobs() -> set[str]:
    d = Path(os.environ["LOCALINFER_HOME"]) / "models" / "blobs"
    return {p.name.removeprefix("sha256-") for p in d.iterdir()} if d.is_dir() else set()


def listed() -> dict[str, dict]:
    r = invoke("list", "--json")
    assert r.exit_code == 0, r.stderr
    return {m["name"]: m for m in json.loads(r.stdout)["models"]}


def shown(name: str) -> dict:
    r = invoke("show", name, "--json")
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def projectors(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("projectors")
    return {q: write_projector(d / f"{q}.gguf", seed=s) for q, s in (("Q4_K_M", 1), ("F16", 2), ("BF16", 3))}


@pytest.fixture
def hub(fake_hub: FakeHub, projectors) -> FakeHub:  # noqa: F811
    fake_hub.add_file(VIS, "vis-Q4_K_M.gguf", gguf_bytes(name="vis q4km", payload=os.urandom(200_000)))
    fake_hub.add_file(VIS, "vis-Q8_0.gguf", gguf_bytes(name="vis q8", payload=os.urandom(1000)))
    fake_hub.add_file(VIS, "mmproj-vis-Q4_K_M.gguf", projectors["Q4_K_M"])
    fake_hub.add_file(VIS, "mmproj-vis-F16.gguf", projectors["F16"])
    fake_hub.add_file(VIS, "mmproj-vis-BF16.gguf", projectors["BF16"])
    fake_hub.add_file(TEXT, "text-Q4_K_M.gguf", gguf_bytes(name="text"))
    return fake_hub


def sha(hub: FakeHub, name: str, repo: str = VIS) -> str:
    return hub.repos[repo].files[name].sha256


def test_a_default_pull_takes_the_projector_of_the_models_quant(hub: FakeHub) -> None:
    r = invoke("pull", VIS)
    assert r.exit_code == 0, r.stderr
    assert "with its projector (images in)" in r.stderr and "pulling mmproj-vis-Q4_K_M.gguf" in r.stderr
    d = shown(f"{VIS}:Q4_K_M")
    assert d["vision"] is True and d["projector"].endswith(sha(hub, "mmproj-vis-Q4_K_M.gguf"))
    assert listed()[f"{VIS}:Q4_K_M"]["vision"] is True
    assert blobs() == {sha(hub, "vis-Q4_K_M.gguf"), sha(hub, "mmproj-vis-Q4_K_M.gguf")}  # only the one that matches
    # a quant without its own projector takes the float one (F16 before BF16)
    assert invoke("pull", f"{VIS}:Q8_0").exit_code == 0
    assert shown(f"{VIS}:Q8_0")["projector"].endswith(sha(hub, "mmproj-vis-F16.gguf"))
    # projectors are not models: the quants on offer do not list them
    none = invoke("pull", f"{VIS}:Q3_K_M")
    assert none.exit_code == 3 and "available: Q4_K_M, Q8_0" in none.stderr, none.stderr
    # rm takes both away
    assert invoke("rm", f"{VIS}:Q4_K_M").exit_code == 0 and invoke("rm", f"{VIS}:Q8_0").exit_code == 0
    assert blobs() == set()


def test_a_repo_without_projectors_pulls_as_before(hub: FakeHub) -> None:
    r = invoke("pull", TEXT)
    assert r.exit_code == 0, r.stderr
    assert "projector" not in r.stderr and "mmproj" not in r.stderr  # not a word about images
    assert shown(f"{TEXT}:Q4_K_M")["vision"] is False and blobs() == {sha(hub, "text-Q4_K_M.gguf", TEXT)}
    asked = invoke("pull", TEXT, "--name", "asked", "--mmproj", "auto")  # asked for: told there is none
    assert asked.exit_code == 0 and "holds no mmproj file" in asked.stderr


def test_the_flag_chooses_or_skips_the_projector(hub: FakeHub) -> None:
    r = invoke("pull", VIS, "--mmproj", "mmproj-vis-BF16.gguf")
    assert r.exit_code == 0, r.stderr
    assert shown(f"{VIS}:Q4_K_M")["projector"].endswith(sha(hub, "mmproj-vis-BF16.gguf"))
    for skip in (["--no-mmproj"], ["--mmproj", "none"]):
        r = invoke("pull", VIS, "--name", "plain", *skip)
        assert r.exit_code == 0, r.stderr
        assert shown("plain")["vision"] is False and "with its projector" not in r.stderr
    # the re-pull without it leaves the first model's projector where it is
    assert shown(f"{VIS}:Q4_K_M")["vision"] is True
    assert blobs() == {sha(hub, "vis-Q4_K_M.gguf"), sha(hub, "mmproj-vis-BF16.gguf")}
    both = invoke("pull", VIS, "--no-mmproj", "--mmproj", "mmproj-vis-F16.gguf")
    assert both.exit_code == 2 and "opposite" in both.stderr
    n = len(hub.log)
    missing = invoke("pull", VIS, "--name", "nope", "--mmproj", "mmproj-nope.gguf")
    assert missing.exit_code == 3 and "projectors there: mmproj-vis-BF16.gguf, mmproj-vis-F16.gguf, mmproj-vis-Q4_K_M.gguf" in missing.stderr
    assert not [q for q in hub.log[n:] if q["method"] == "GET" and "/resolve/" in q["path"]]  # refused before any download


def test_a_projector_cut_mid_download_installs_nothing_then_resumes(hub: FakeHub) -> None:
    proj = "mmproj-vis-Q4_K_M.gguf"
    hub.fault(VIS, proj, "cut_at", offset=300_000)
    r = invoke("pull", VIS)
    assert r.exit_code == 5, r.stderr
    assert "Traceback" not in r.stderr
    assert listed() == {}  # no model without its projector
    assert blobs() == {sha(hub, "vis-Q4_K_M.gguf")}  # its verified bytes, unlisted, for the next pull (as a split's shards)
    hub.repos[VIS].files[proj].faults.pop("cut_at")
    n = len(hub.log)
    r = invoke("pull", VIS)
    assert r.exit_code == 0, r.stderr
    gets = [q for q in hub.log[n:] if q["method"] == "GET" and "/resolve/" in q["path"]]
    assert [(q["path"].rsplit("/", 1)[-1], q["range"]) for q in gets] == [(proj, "bytes=300000-")]  # the model not again
    assert shown(f"{VIS}:Q4_K_M")["projector"].endswith(sha(hub, proj))


def test_a_failed_projector_does_not_damage_the_installed_model(hub: FakeHub, tmp_path) -> None:
    assert invoke("pull", VIS).exit_code == 0
    before = shown(f"{VIS}:Q4_K_M")
    # upstream: a new projector, whose download dies; and then one that is not a projector at all
    hub.add_file(VIS, "mmproj-vis-Q4_K_M.gguf", write_projector(tmp_path / "new.gguf", seed=9))
    hub.fault(VIS, "mmproj-vis-Q4_K_M.gguf", "cut_at", offset=100_000)
    assert invoke("pull", VIS).exit_code == 5
    assert shown(f"{VIS}:Q4_K_M") == before
    hub.add_file(VIS, "mmproj-vis-Q4_K_M.gguf", gguf_bytes(name="a llama, not a projector"))
    bad = invoke("pull", VIS)
    assert bad.exit_code != 0 and "is not a projector" in bad.stderr and "Traceback" not in bad.stderr
    assert shown(f"{VIS}:Q4_K_M") == before
    assert blobs() == {sha(hub, "vis-Q4_K_M.gguf"), before["projector"].rsplit("sha256-", 1)[-1]}
    from localinfer.store import resolve_model

    assert resolve_model(f"{VIS}:Q4_K_M").mmproj is not None  # still verified whole


def test_a_models_toml_entry_names_its_projector(hub: FakeHub) -> None:
    config = Path(os.environ["LOCALINFER_HOME"]) / "config"
    config.mkdir(parents=True)
    (config / "models.toml").write_text(
        f'[models."vis:named"]\nrepo = "{VIS}"\nfile = "vis-Q4_K_M.gguf"\nmmproj = "mmproj-vis-F16.gguf"\n'
        f'[models."vis:plain"]\nrepo = "{VIS}"\nfile = "vis-Q4_K_M.gguf"\nmmproj = "none"\n'
        f'[models."vis:auto"]\nrepo = "{VIS}"\nfile = "vis-Q4_K_M.gguf"\n'
    )
    for name, want in (("vis:named", "mmproj-vis-F16.gguf"), ("vis:plain", None), ("vis:auto", "mmproj-vis-Q4_K_M.gguf")):
        r = invoke("pull", name)
        assert r.exit_code == 0, r.stderr
        d = shown(name)
        assert d["vision"] is (want is not None)
        if want:
            assert d["projector"].endswith(sha(hub, want))
    over = invoke("pull", "vis:named", "--no-mmproj")  # the command's flag wins over the file's key
    assert over.exit_code == 0 and shown("vis:named")["vision"] is False


def test_an_offline_pull_verifies_the_projector_too(hub: FakeHub) -> None:
    assert invoke("pull", VIS).exit_code == 0
    assert invoke("pull", VIS, "--offline").exit_code == 0
    blob = Path(os.environ["LOCALINFER_HOME"]) / "models" / "blobs" / f"sha256-{sha(hub, 'mmproj-vis-Q4_K_M.gguf')}"
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    r = invoke("pull", VIS, "--offline")
    assert r.exit_code == 4 and "projector" in r.stderr, r.stderr
