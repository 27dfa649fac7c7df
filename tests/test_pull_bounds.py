"""`pull` against a Hub that lies or breaks in ways that once cost unbounded memory or time: a
listing that inflates without end, bodies that always stop short while Range is ignored; and what a
failed download leaves behind (no empty partial file) and says (the bytes really written)."""

from __future__ import annotations

import errno
import gzip
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import run_cli
from fakehub import FakeHub, fake_hub, gzip_bomb, hub_env  # noqa: F401 - fixtures
from ggufsynth import gguf_bytes
from localinfer.cli.main import build_app

# synthetic GGUFs that llama.cpp cannot load: the store's mechanics, without the probe (conftest)
pytestmark = pytest.mark.usefixtures("unprobed")

REPO = "acme/Tiny-GGUF"
FILE = "tiny-Q4_K_M.gguf"
MiB = 1 << 20


def invoke(*args: str):
    return CliRunner().invoke(build_app(), list(args))


def store_dir(sub: str) -> list[Path]:
    d = Path(os.environ["LOCALINFER_HOME"]) / "models" / sub
    return sorted(d.iterdir()) if d.is_dir() else []


def listing_json(hub: FakeHub, repo: str) -> bytes:
    with urllib.request.urlopen(f"{hub.url}/api/models/{repo}?blobs=True") as resp:
        return resp.read()


@pytest.fixture
def hub(fake_hub: FakeHub) -> FakeHub:  # noqa: F811
    fake_hub.add_file(REPO, FILE, gguf_bytes(name="tiny", payload=os.urandom(1_500_000)))
    return fake_hub


# ---- the listing --------------------------------------------------------------------------------

# Linux keeps a process's peak RSS across exec: a child of a large pytest process starts with the
# parent's. Resetting the peak first (clear_refs 5) measures this command alone.
_PEAK_RSS = r"""
import resource, sys
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    def peak_kib():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
except OSError:
    def peak_kib():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
sys.argv = ["localinfer", *sys.argv[1:]]
try:
    from localinfer.cli.main import main
    main()
finally:
    sys.stderr.write(f"peak_rss_kib={peak_kib()}\n")
"""


def test_a_gzip_bomb_listing_is_refused_in_bounded_memory(hub: FakeHub) -> None:
    """256 MiB of padding inside a valid listing, in 1.6 MB of gzip: refused once 16 MiB are inflated."""
    plain = listing_json(hub, REPO)
    head = plain[:-1] + b', "padding": "  '
    hub.repos[REPO].info_raw = (gzip_bomb(head, 256 * MiB, b'"}'), {"Content-Encoding": "gzip"})
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, "pull", REPO], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 5, proc.stderr
    assert lines[0] == f"Error: refusing the Hub's listing of {REPO}: it is larger than 16 MiB once inflated", proc.stderr
    assert lines[1].startswith("  hint: nothing was downloaded")
    peak = int(lines[-1].removeprefix("peak_rss_kib=")) * 1024
    assert peak < 200 * MiB, f"peak RSS {peak / MiB:.0f} MiB"  # the whole bomb alone is 256 MiB
    assert store_dir("blobs") == [] and store_dir("partial") == []


def test_a_listing_larger_than_the_bound_on_the_wire_is_refused(hub: FakeHub) -> None:
    plain = listing_json(hub, REPO)
    hub.repos[REPO].info_raw = (plain[:-1] + b', "padding": "' + b" " * (17 * MiB) + b'"}', {})
    r = invoke("pull", REPO)
    assert r.exit_code == 5, r.stderr
    assert f"Error: refusing the Hub's listing of {REPO}: it is larger than 16 MiB\n" in r.stderr


def test_a_gzip_encoded_listing_of_normal_size_is_read(hub: FakeHub) -> None:
    hub.repos[REPO].info_raw = (gzip.compress(listing_json(hub, REPO)), {"Content-Encoding": "gzip"})
    r = invoke("pull", REPO)
    assert r.exit_code == 0, r.stderr
    assert len(store_dir("blobs")) == 1


def test_a_listing_in_an_encoding_we_do_not_read_is_refused(hub: FakeHub) -> None:
    hub.repos[REPO].info_raw = (b"\x28\xb5\x2f\xfd", {"Content-Encoding": "zstd"})
    r = invoke("pull", REPO)
    assert r.exit_code == 5, r.stderr
    assert f"refusing the Hub's listing of {REPO}: it is encoded as 'zstd'" in r.stderr


def test_hub_errors_still_come_through_the_bounded_listing(fake_hub: FakeHub) -> None:  # noqa: F811
    r = invoke("pull", "acme/Nowhere-GGUF")
    assert r.exit_code == 3, r.stderr
    assert "repository acme/Nowhere-GGUF not found on the Hub" in r.stderr


# ---- downloads ----------------------------------------------------------------------------------


def test_pull_gives_up_when_range_is_ignored_and_every_body_stops_short(hub: FakeHub) -> None:
    """Each GET answers 200 from byte 0 and stops at the same byte: restarting is not progress."""
    hub.fault(REPO, FILE, "ignore_range")
    hub.fault(REPO, FILE, "cut_at", offset=400_000)
    proc = run_cli("pull", REPO, timeout=90)  # before: 176 GETs in 45 s, never ending
    err = proc.stderr.decode()
    assert proc.returncode == 5, err
    assert f"downloading {FILE} failed after 5 retries: the server ignores resume requests" in err
    assert "(at most 400000;" in err
    gets = [r for r in hub.requests("GET") if FILE in r["path"]]
    assert len(gets) <= 7, len(gets)  # the first try and the retries, no more
    assert not any(p.stat().st_size > 400_000 for p in store_dir("partial"))
    assert store_dir("blobs") == []


def test_a_refused_download_leaves_no_empty_partial_file(hub: FakeHub) -> None:
    hub.fault(REPO, FILE, "refuse", status=403)
    r = invoke("pull", REPO)
    assert r.exit_code == 5, r.stderr
    assert f"the Hub refused access to {REPO}/{FILE} (HTTP 403)" in r.stderr
    assert store_dir("partial") == []


class _DiskFillsAfter:
    """``os`` for transfer.py, whose ``write`` fails with ENOSPC once ``room`` bytes are written."""

    def __init__(self, room: int) -> None:
        self.room = room

    def __getattr__(self, name: str):
        return getattr(os, name)

    def write(self, fd: int, data) -> int:
        if len(data) > self.room:
            if self.room:
                n = os.write(fd, bytes(data[: self.room]))
                self.room = 0
                return n
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return os.write(fd, data)


def test_a_full_disk_reports_the_bytes_really_written(hub: FakeHub, monkeypatch) -> None:
    from localinfer.store.sources import transfer

    monkeypatch.setattr(transfer, "os", _DiskFillsAfter(1_000_000))
    r = invoke("pull", REPO)
    assert r.exit_code == 6, r.stderr
    assert f"the disk filled up while downloading {FILE}: 1.0 MB of 1.5 MB written to " in r.stderr, r.stderr
    (part,) = store_dir("partial")
    assert part.stat().st_size == 1_000_000  # kept: the next pull resumes it


def test_a_disk_full_before_the_first_byte_says_so_and_leaves_nothing(hub: FakeHub, monkeypatch) -> None:
    from localinfer.store.sources import transfer

    monkeypatch.setattr(transfer, "os", _DiskFillsAfter(0))
    r = invoke("pull", REPO)
    assert r.exit_code == 6, r.stderr
    assert f"the disk is full: not a byte of {FILE} could be written in " in r.stderr, r.stderr
    assert "0 bytes" not in r.stderr and store_dir("partial") == []
