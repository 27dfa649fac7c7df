"""Hostile inputs to the store: a lying Hub, links planted in the store, a manifest of the wrong shape.

A Hub whose listing or headers carry malformed values (digests that are paths, negative sizes, commit
ids with escape bytes) is refused before anything is downloaded, with the network exit code (5), and
no control character reaches the terminal. Files the store writes in place are never opened through
a link someone planted there. A manifest we cannot understand is never overwritten; one bad entry is
reported and skipped while the others keep working.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fakehub import FakeHub, fake_hub, hub_env  # noqa: F401 - fixtures
from ggufsynth import gguf_bytes
from localinfer.cli.main import build_app

# synthetic GGUFs that llama.cpp cannot load: the store's mechanics, without the probe (conftest)
pytestmark = pytest.mark.usefixtures("unprobed")

REPO = "acme/Tiny-GGUF"
FILE = "tiny-Q4_K_M.gguf"
SPLIT = "acme/Big-GGUF"
TRAVERSAL = "x/" + "../" * 4 + "pwned"  # from partial/sha256-x/ up to the test's tmp_path


def invoke(*args: str):
    return CliRunner().invoke(build_app(), list(args), catch_exceptions=False)


def store() -> Path:
    return Path(os.environ["LOCALINFER_HOME"]) / "models"


def outside(tmp_path: Path) -> list[Path]:
    """Files the pull left outside the store (the fake Hub's data and the HF cache aside)."""
    allowed = (store(), tmp_path / "hubdata", tmp_path / "hf", tmp_path / "outside")
    return [
        p
        for p in tmp_path.rglob("*")
        if (p.is_file() or p.is_symlink()) and not any(p.is_relative_to(a) for a in allowed)
    ]


def installed() -> list[str]:
    r = invoke("list", "--json")
    assert r.exit_code == 0, r.stderr
    return [m["name"] for m in json.loads(r.stdout)["models"]]


@pytest.fixture
def hub(fake_hub: FakeHub) -> FakeHub:  # noqa: F811
    fake_hub.add_file(REPO, FILE, gguf_bytes(name="tiny", payload=os.urandom(300_000)))
    for i in (1, 2):
        fake_hub.add_file(SPLIT, f"big-Q6_K-{i:05d}-of-00002.gguf", gguf_bytes(name="big", split=(i - 1, 2)))
    return fake_hub


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the store that a planted link points at: it must never change."""
    path = tmp_path / "outside" / "victim.txt"
    path.parent.mkdir()
    path.write_bytes(b"precious, not a model\n")
    return path


def assert_refused(r, hub: FakeHub, tmp_path: Path, what: str) -> None:
    assert r.exit_code == 5, r.stderr
    assert what in r.stderr and "nothing was downloaded" in r.stderr
    assert "\x1b" not in r.stdout + r.stderr and "\x07" not in r.stderr
    assert not hub.requests(None, "/resolve/")  # refused on the listing: not even a HEAD
    assert outside(tmp_path) == []
    assert installed() == []


# ---- 1. a lying Hub ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "claim",
    [
        {"sha256": TRAVERSAL},
        {"sha256": "\x1b[2J\x1b]0;pwned\x07" + "a" * 50},
        {"sha256": "a" * 63},
        {"sha256": "a" * 64 + "\n"},
        {"sha256": 12345},
        {"size": -1},
        {"size": "300"},
        {"size": 10**30},
    ],
    ids=["traversal", "escapes", "short", "newline", "number", "negative", "string", "huge"],
)
def test_a_listing_with_a_malformed_digest_or_size_is_refused(hub: FakeHub, tmp_path: Path, claim: dict) -> None:
    hub.fault(REPO, FILE, "claim", **claim)
    r = invoke("pull", REPO)
    assert_refused(r, hub, tmp_path, f"invalid {next(iter(claim))} for {FILE}")


@pytest.mark.parametrize(
    "override, what",
    [
        ({"sha": "../../x"}, "invalid commit id"),
        ({"sha": "\x1b[31m" + "0" * 35}, "invalid commit id"),
        ({"sha": 7}, "invalid commit id"),
        ({"siblings": "abc"}, "malformed"),
        ({"siblings": [{"rfilename": FILE, "lfs": {"sha256": "a" * 64}}]}, "malformed"),
    ],
)
def test_a_malformed_commit_or_listing_is_refused(hub: FakeHub, tmp_path: Path, override: dict, what: str) -> None:
    hub.repos[REPO].info_override = override
    assert_refused(invoke("pull", REPO), hub, tmp_path, what)


def test_unsafe_names_are_refused_and_never_printed_raw(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_file(REPO, "tiny\x1b[2J-Q8_0.gguf", gguf_bytes())
    assert_refused(invoke("pull", REPO), hub, tmp_path, "unsafe")


def test_names_of_files_never_fetched_do_not_matter(hub: FakeHub) -> None:
    hub.add_file(REPO, "README\x1b[2J.md", b"# hi\n")
    hub.add_file(REPO, "../../notes.txt", b"hi\n")
    r = invoke("pull", REPO)
    assert r.exit_code == 0, r.stderr
    assert "\x1b" not in r.stderr and installed() == [f"{REPO}:Q4_K_M"]


def test_an_etag_that_is_not_a_digest_is_never_used(hub: FakeHub, tmp_path: Path) -> None:
    hub.fault(REPO, FILE, "claim", no_lfs=True)
    hub.fault(REPO, FILE, "etag", value=TRAVERSAL)
    r = invoke("pull", REPO)
    assert r.exit_code == 4 and "gives no sha256" in r.stderr  # no digest to check it with: not fetched
    assert not hub.requests("GET", "/resolve/") and outside(tmp_path) == []


def test_an_etag_digest_is_used_when_the_listing_has_none(hub: FakeHub) -> None:
    hub.fault(REPO, FILE, "claim", no_lfs=True)
    assert invoke("pull", REPO).exit_code == 0
    assert installed() == [f"{REPO}:Q4_K_M"]


def test_a_redirect_to_a_local_file_is_refused(hub: FakeHub, tmp_path: Path, victim: Path) -> None:
    hub.fault(REPO, FILE, "location", value=victim.as_uri())
    r = invoke("pull", REPO)
    assert r.exit_code == 5 and "invalid download location" in r.stderr, r.stderr
    assert not (store() / "partial").is_dir() or not any((store() / "partial").iterdir())


def test_a_redirect_loop_is_a_network_error(hub: FakeHub, tmp_path: Path) -> None:
    # The file redirects to its own URL, for ever: "internal error: TooManyRedirects" before.
    hub.fault(REPO, FILE, "location", value=f"{hub.url}/{REPO}/resolve/main/{FILE}")
    r = invoke("pull", REPO)
    assert r.exit_code == 5 and "redirect" in r.stderr and "internal error" not in r.stderr, r.stderr
    assert installed() == []


def test_server_text_in_messages_is_escaped() -> None:
    from localinfer.store.sources.transfer import _describe, _total_from
    from localinfer.store.untrusted import shown

    assert _describe(ValueError("bad \x1b[2J status\x9b line")) == "ValueError: bad \\x1b[2J status\\x9b line"
    assert shown("a\u202eb" + "c" * 100).startswith("a\\u202eb") and shown("x" * 100).endswith("...")
    assert _total_from({"Content-Length": "\xb2"}, 0) is None  # '²'.isdigit() is True, int('²') fails


# ---- 2. links planted in the store --------------------------------------------------------------


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_a_link_planted_in_partial_is_replaced_not_followed(hub: FakeHub, victim: Path, kind: str) -> None:
    f = hub.repos[REPO].files[FILE]
    part = store() / "partial" / f"sha256-{f.sha256}.part"
    part.parent.mkdir(parents=True)
    (os.symlink if kind == "symlink" else os.link)(victim, part)
    r = invoke("pull", REPO)
    assert r.exit_code == 0, r.stderr
    assert victim.read_bytes() == b"precious, not a model\n"
    blob = store() / "blobs" / f"sha256-{f.sha256}"
    assert not blob.is_symlink() and blob.read_bytes() == f.path.read_bytes()


@pytest.mark.parametrize("lock", ["sha256-{sha}.lock", "manifest.lock", "verified.lock"])
def test_a_link_planted_as_a_lock_is_replaced_not_followed(hub: FakeHub, victim: Path, lock: str) -> None:
    f = hub.repos[REPO].files[FILE]
    path = store() / "locks" / lock.format(sha=f.sha256)
    path.parent.mkdir(parents=True)
    path.symlink_to(victim)
    assert invoke("pull", REPO).exit_code == 0
    assert invoke("rm", f"{REPO}:Q4_K_M").exit_code == 0
    assert victim.read_bytes() == b"precious, not a model\n"


def test_a_symlink_planted_as_a_blob_is_not_trusted(hub: FakeHub, tmp_path: Path) -> None:
    f = hub.repos[REPO].files[FILE]
    elsewhere = tmp_path / "outside" / "copy.gguf"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(f.path.read_bytes())  # the right bytes, but not in the store: could change any time
    blob = store() / "blobs" / f"sha256-{f.sha256}"
    blob.parent.mkdir(parents=True)
    blob.symlink_to(elsewhere)
    assert invoke("pull", REPO).exit_code == 0
    assert not blob.is_symlink() and blob.is_file() and elsewhere.is_file()
    assert len(hub.requests("GET", FILE)) == 1


def test_a_symlink_planted_as_a_split_models_links_folder_is_replaced(hub: FakeHub, tmp_path: Path) -> None:
    first = hub.repos[SPLIT].files["big-Q6_K-00001-of-00002.gguf"]
    elsewhere = tmp_path / "outside" / "dir"
    elsewhere.mkdir(parents=True)
    (elsewhere / "big-Q6_K-00002-of-00002.gguf").write_bytes(b"someone else's file")
    folder = store() / "links" / first.sha256
    folder.parent.mkdir(parents=True)
    folder.symlink_to(elsewhere, target_is_directory=True)
    r = invoke("pull", f"{SPLIT}:Q6_K")
    assert r.exit_code == 0, r.stderr
    assert not folder.is_symlink() and len(list(folder.iterdir())) == 2
    assert [p.name for p in elsewhere.iterdir()] == ["big-Q6_K-00002-of-00002.gguf"]
    assert (elsewhere / "big-Q6_K-00002-of-00002.gguf").read_bytes() == b"someone else's file"


def test_assembling_a_package_never_writes_through_a_link(tmp_path: Path, victim: Path, monkeypatch) -> None:
    from localinfer.store.sources.packages import assemble_into

    pkg = tmp_path / "pkgs" / "chunky_model_pkg"
    pkg.mkdir(parents=True)
    (pkg / "a.bin").write_bytes(b"GGUF" + b"1" * 100)
    (pkg / "b.bin").write_bytes(b"2" * 100)
    (pkg / "__init__.py").write_text(
        "from pathlib import Path\n"
        "def chunk_paths():\n"
        "    here = Path(__file__).parent\n"
        "    return [here / 'a.bin', here / 'b.bin']\n"
    )
    monkeypatch.syspath_prepend(str(pkg.parent))
    monkeypatch.delitem(sys.modules, "chunky_model_pkg", raising=False)
    dest = store() / "partial" / "sha256-x.assemble"
    dest.parent.mkdir(parents=True)
    dest.symlink_to(victim)
    assemble_into("chunky_model_pkg", dest, None, None)
    assert victim.read_bytes() == b"precious, not a model\n"
    assert not dest.is_symlink() and dest.read_bytes() == b"GGUF" + b"1" * 100 + b"2" * 100


def test_open_in_store_without_o_nofollow_checks_first(tmp_path: Path, victim: Path, monkeypatch) -> None:
    # Windows has no O_NOFOLLOW: an lstat check before opening stands in for it.
    from localinfer.store import fsutil

    monkeypatch.setattr(fsutil, "_NOFOLLOW", 0)
    path = tmp_path / "planted"
    path.symlink_to(victim)
    fd = fsutil.open_in_store(path, os.O_RDWR | os.O_TRUNC)
    os.write(fd, b"ours")
    os.close(fd)
    assert victim.read_bytes() == b"precious, not a model\n"
    assert not path.is_symlink() and path.read_bytes() == b"ours"


def test_store_locks_still_exclude_other_holders(tmp_path: Path) -> None:
    # The locks are our own (flock on a descriptor opened without following links): another
    # descriptor, in this process or another, must not get the lock while it is held.
    import subprocess

    from localinfer.store.fsutil import file_lock, try_file_lock

    path = tmp_path / "locks" / "sha256-x.lock"
    probe = (
        "import sys; from pathlib import Path; from localinfer.store.fsutil import try_file_lock\n"
        "with try_file_lock(Path(sys.argv[1])) as mine: print(mine)"
    )

    def other_process_gets_it() -> bool:
        out = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip() == "True"

    with file_lock(path):
        with try_file_lock(path) as mine:
            assert mine is False
        assert not other_process_gets_it()
    assert other_process_gets_it()
    with try_file_lock(path) as mine:
        assert mine is True


# ---- 3. a manifest of the wrong shape -----------------------------------------------------------


@pytest.mark.parametrize(
    "content, problem",
    [
        ({"version": 1, "models": [{"name": "smol"}]}, "does not hold a table of models"),
        ([1, 2], "does not hold a table of models"),
        ({"version": 99, "models": {}}, "has version '99'"),
    ],
    ids=["models-list", "top-list", "newer"],
)
def test_a_manifest_of_the_wrong_shape_is_refused_and_never_overwritten(
    hub: FakeHub, content: object, problem: str
) -> None:
    manifest = store() / "manifest.json"
    manifest.parent.mkdir(parents=True)
    raw = json.dumps(content).encode()
    manifest.write_bytes(raw)
    for args in (["list"], ["pull", REPO], ["rm", "smol"]):
        r = invoke(*args)
        assert r.exit_code == 1, (args, r.stderr)
        assert problem in r.stderr and "left untouched" in r.stderr and "a copy is in" in r.stderr
        assert manifest.read_bytes() == raw
    backups = list(store().glob("manifest.unreadable-*.json"))
    assert len(backups) == 1 and backups[0].read_bytes() == raw
    assert not hub.requests(None, "/resolve/")


def test_bad_manifest_entries_are_skipped_and_kept(hub: FakeHub) -> None:
    assert invoke("pull", REPO).exit_code == 0
    good_name = f"{REPO}:Q4_K_M"
    manifest = store() / "manifest.json"
    data = json.loads(manifest.read_text())
    good = data["models"][good_name]
    bad = {
        "smol": 5,
        "empty": {},
        "strfiles": {**good, "name": "strfiles", "files": "abc"},
        "twin": {**good, "name": "twin", "header": 5},  # unusable, but it names the good model's blob
        "escape": {**good, "name": "escape", "files": [{**good["files"][0], "sha256": TRAVERSAL}]},
        "odd\x1b[2J": {**good, "name": "odd\x1b[2J", "load": "../../etc/passwd"},
    }
    data["models"].update(bad)
    manifest.write_text(json.dumps(data))

    r = invoke("list", "--json")
    assert r.exit_code == 0, r.stderr
    assert [m["name"] for m in json.loads(r.stdout)["models"]] == [good_name]
    for name in ("smol", "empty", "strfiles", "twin", "escape", "odd\\x1b[2J"):
        assert f"warning: skipping the model '{name}'" in r.stderr
    assert "\x1b" not in r.stderr
    assert invoke("verify").exit_code == 0
    assert invoke("show", good_name).exit_code == 0

    blob = store() / "blobs" / f"sha256-{good['files'][0]['sha256']}"
    assert invoke("rm", good_name).exit_code == 0
    assert blob.is_file()  # "twin" may still need it: never deleted under an entry we cannot read
    assert json.loads(manifest.read_text())["models"] == bad  # written back as they were

    assert invoke("rm", "smol").exit_code == 0  # a bad entry can be forgotten
    assert "smol" not in json.loads(manifest.read_text())["models"]
    assert invoke("pull", REPO, "--name", "twin").exit_code == 0  # or replaced by pulling again
    assert "twin" in installed()
