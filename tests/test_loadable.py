"""No GGUF may abort the interpreter: files llama.cpp would abort on are refused (exit 4) after a
test load in a child process (engine/probe.py), remembered by sha256 (store/loadable.py).

The bad files are SmolLM2 with its header mutated (tests/ggufmutate.py): the kinds that reached
llama.cpp's asserts, and a few hundred seeded random mutants.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import run_cli
from fakehub import fake_hub, hub_env  # noqa: F401 - fixtures
from ggufmutate import duplicate_token, norm_as_f16, read_layout, write_layout
from ggufsynth import write_gguf
from localinfer.cli.main import build_app
from localinfer.engine.probe import last_words

DUP_ASSERT = "GGML_ASSERT(id_to_token.size() == token_to_id.size()) failed"
F16_ABORT = "binary_op: unsupported types"


@pytest.fixture(scope="module")
def smollm2_layout(smollm2_path):
    return read_layout(smollm2_path)


@pytest.fixture
def dup_gguf(tmp_path, smollm2_layout) -> Path:
    return write_layout(duplicate_token(smollm2_layout.copy()), tmp_path / "dup.gguf")


@pytest.fixture
def f16_norm_gguf(tmp_path, smollm2_layout) -> Path:
    return write_layout(norm_as_f16(smollm2_layout.copy()), tmp_path / "f16norm.gguf")


def models_dir() -> Path:
    return Path(os.environ["LOCALINFER_HOME"]) / "models"


def manifest_models() -> dict:
    path = models_dir() / "manifest.json"
    return json.loads(path.read_text())["models"] if path.exists() else {}


def blobs() -> list[Path]:
    d = models_dir() / "blobs"
    return sorted(d.iterdir()) if d.is_dir() else []


def assert_aborted_refusal(proc: subprocess.CompletedProcess, name: str, needle: str) -> None:
    err = proc.stderr.decode()
    assert proc.returncode == 4, err  # not 134 (SIGABRT)
    assert proc.stdout == b"" and "Traceback" not in err
    lines = [ln for ln in err.splitlines() if not ln.startswith("hashing ")]
    assert lines[0].startswith(f"Error: {name}: llama.cpp aborted loading this file: "), err
    assert needle in lines[0], err
    assert lines[1].startswith("  hint: llama.cpp cannot use this file"), err


# ---- the two kinds the attack found ------------------------------------------------------------


@pytest.mark.slow
def test_run_of_a_file_with_a_duplicate_token_exits_4_with_llama_cpps_assert(dup_gguf) -> None:
    proc = run_cli("run", "-m", str(dup_gguf), "-p", "hi", "-n", "1", timeout=180)
    assert_aborted_refusal(proc, "dup.gguf", DUP_ASSERT)
    # remembered by its sha256: the verdict is in loadable.json, and the next run says the same
    verdicts = json.loads((models_dir() / "loadable.json").read_text())
    assert [v["kind"] for v in verdicts.values()] == ["aborted"]
    assert DUP_ASSERT in next(iter(verdicts.values()))["message"]
    again = run_cli("run", "-m", str(dup_gguf), "-p", "hi", "-n", "1", timeout=180)
    assert_aborted_refusal(again, "dup.gguf", DUP_ASSERT)


@pytest.mark.slow
def test_pull_of_a_file_with_a_norm_stored_as_f16_installs_nothing(f16_norm_gguf) -> None:
    proc = run_cli("pull", str(f16_norm_gguf), "--name", "bad", timeout=180)
    assert_aborted_refusal(proc, "f16norm.gguf", F16_ABORT)
    assert "bad" not in manifest_models()
    listed = run_cli("list", "--json")
    assert "bad" not in {m["name"] for m in json.loads(listed.stdout)["models"]}


@pytest.mark.slow
def test_a_bpe_vocabulary_declared_as_spm_is_refused(tmp_path, smollm2_layout) -> None:
    """Found by the fuzz test below: with tokenizer.ggml.model = llama, the first byte a prompt needs
    that has no <0xNN> token throws std::out_of_range out of llama_tokenize (a chat template's
    newline is enough); the probe tokenizes a text that holds every byte value."""
    from ggufmutate import T_STRING

    layout = smollm2_layout.copy()
    layout.set_scalar("tokenizer.ggml.model", T_STRING, "llama")
    path = write_layout(layout, tmp_path / "spm.gguf", sparse=True)  # the weights do not matter here
    proc = run_cli("run", "-m", str(path), "-p", "hi", "-n", "1", timeout=180)
    assert_aborted_refusal(proc, "spm.gguf", "unordered_map::at")


@pytest.mark.slow
def test_serve_refuses_the_file_before_it_starts(dup_gguf) -> None:
    pytest.importorskip("uvicorn")
    proc = run_cli("serve", "-m", str(dup_gguf), "--port", "0", timeout=180)
    assert_aborted_refusal(proc, "dup.gguf", DUP_ASSERT)


@pytest.mark.slow
def test_hub_pull_of_a_file_llama_cpp_aborts_on_leaves_no_blob(fake_hub, smollm2_layout, tmp_path) -> None:  # noqa: F811
    bad = write_layout(duplicate_token(smollm2_layout.copy()), tmp_path / "src.gguf")
    fake_hub.add_file("acme/Bad-GGUF", "bad-Q4_1.gguf", bad)
    r = CliRunner().invoke(build_app(), ["pull", "acme/Bad-GGUF:Q4_1"])
    assert r.exit_code == 4, r.stderr
    assert f"bad-Q4_1.gguf: llama.cpp aborted loading this file: {DUP_ASSERT}" in r.stderr
    assert manifest_models() == {} and blobs() == []
    partial = models_dir() / "partial"
    assert not partial.is_dir() or list(partial.iterdir()) == []


# ---- what is remembered, and for how long -------------------------------------------------------


class Counted:
    """Wraps a function, counting calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *a, **kw):
        self.calls += 1
        return self.fn(*a, **kw)


@pytest.fixture
def counters(monkeypatch):
    from localinfer.engine import probe
    from localinfer.store import loadable

    probes, hashes = Counted(probe.probe_file), Counted(loadable.sha256_file)
    monkeypatch.setattr(probe, "probe_file", probes)
    monkeypatch.setattr(loadable, "sha256_file", hashes)
    return probes, hashes


@pytest.mark.slow
def test_a_file_used_in_place_is_hashed_and_probed_once(smollm2_path, tmp_path, counters, monkeypatch) -> None:
    from localinfer.engine import probe
    from localinfer.store import resolve_model

    probes, hashes = counters
    local = tmp_path / "m.gguf"
    # a copy, not a hard link: utime below would change the installed package's own mtime, and the
    # next run of this test would find the file "touched" already (it failed on its second run)
    local.write_bytes(smollm2_path.read_bytes())
    first = resolve_model(str(local))
    assert (probes.calls, hashes.calls) == (1, 1) and first.sha256 is not None
    second = resolve_model(str(local))
    assert (probes.calls, hashes.calls) == (1, 1) and second.sha256 == first.sha256  # (path, size, mtime) -> sha256
    os.utime(local, ns=(1, 1))  # touched: hashed again; the same bytes are still proven
    resolve_model(str(local))
    assert (probes.calls, hashes.calls) == (1, 2)
    monkeypatch.setattr(probe, "engine_version", lambda: "llama-cpp-python 9.9.9")  # another llama.cpp: tried again
    resolve_model(str(local))
    assert probes.calls == 2


@pytest.mark.slow
def test_an_entry_installed_unprobed_is_probed_at_first_use_and_keeps_the_verdict(smollm2_path, counters, monkeypatch) -> None:
    from localinfer.store import resolve_model
    from localinfer.store.pull import pull_model
    from localinfer.store.types import NullProgress

    probes, _ = counters
    monkeypatch.setenv("LOCALINFER_PROBE", "0")
    entry = pull_model(str(smollm2_path), name="mine", progress=NullProgress())
    assert "loadable" not in entry and probes.calls == 0
    monkeypatch.delenv("LOCALINFER_PROBE")
    resolve_model("mine")
    assert probes.calls == 1 and manifest_models()["mine"]["loadable"]["engine"].startswith("llama-cpp-python")
    resolve_model("mine")
    assert probes.calls == 1


@pytest.mark.parametrize(
    ("result", "error", "remembered"),
    [
        (("refused", "not enough memory to load m.gguf", "ResourceError"), "ResourceError", False),
        (("timeout", "llama.cpp did not finish loading it within 120 s", None), "ModelLoadError", False),
        (("failed", "the test process failed: ImportError: x", None), "ModelLoadError", False),
        (("refused", "m.gguf is not a usable model: bad", "InvalidModelError"), "InvalidModelError", True),
    ],
)
def test_only_verdicts_about_the_file_are_remembered(tmp_path, monkeypatch, result, error, remembered) -> None:
    from localinfer import errors
    from localinfer.engine import probe
    from localinfer.store import resolve_model

    kind, message, cls = result
    monkeypatch.setattr(probe, "probe_file", lambda path: probe.ProbeResult(kind, message, cls))
    path = write_gguf(tmp_path / "m.gguf")
    with pytest.raises(getattr(errors, error)):
        resolve_model(str(path))
    verdicts = models_dir() / "loadable.json"
    assert (verdicts.exists() and len(json.loads(verdicts.read_text())) == 1) is remembered


# ---- the child's last words ---------------------------------------------------------------------


def test_last_words_name_the_assert_or_the_exception() -> None:
    log = "llama_model_loader: loaded meta data\n/src/llama-vocab.cpp:2089: GGML_ASSERT(a == b) failed\n"
    assert last_words(log, -6) == "GGML_ASSERT(a == b) failed"
    cpp = "load_tensors: ...\nterminate called after throwing an instance of 'std::out_of_range'\n  what():  vector::_M_range_check\n"
    assert last_words(cpp, -6) == "vector::_M_range_check"
    assert last_words("llama_model_load: error loading model: bad\n", 1) == "llama_model_load: error loading model: bad"
    assert last_words("nothing useful\n", -11) == "killed by SIGSEGV"
    assert last_words("/x/ggml.c:1: GGML_ASSERT(\x1b[31m) failed", -6) == "GGML_ASSERT(\\x1b[31m) failed"


# ---- chat templates that do not compile (item 8) ------------------------------------------------


BROKEN_TEMPLATE = "{% for m in messages %}{{ m.content }}"  # no endfor


def test_pull_of_a_file_whose_template_does_not_compile_installs_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LOCALINFER_PROBE", "0")  # the template is checked whether or not llama.cpp is tried
    path = write_gguf(tmp_path / "tpl.gguf", chat_template=BROKEN_TEMPLATE)
    r = CliRunner().invoke(build_app(), ["pull", str(path), "--name", "tpl"])
    assert r.exit_code == 4, r.stderr
    line = r.stderr.strip().splitlines()[-2]
    assert line.startswith("Error: tpl.gguf: the model's chat template does not compile: "), r.stderr
    assert "endfor" in line and "(line 1)" in line
    assert manifest_models() == {}


@pytest.mark.llama
def test_run_of_a_file_whose_template_does_not_compile_is_exit_4(tmp_path, fake_engine) -> None:  # noqa: F811
    path = write_gguf(tmp_path / "tpl.gguf", chat_template="{{ messages | nosuchfilter }}")
    r = CliRunner().invoke(build_app(), ["run", "-m", str(path), "-p", "hi"])
    assert r.exit_code == 4, r.stderr
    assert "tpl.gguf: the model's chat template does not compile: " in r.stderr and "nosuchfilter" in r.stderr
    assert "internal error" not in r.stderr and fake_engine.loads == []  # refused before any load


# ---- fuzz: a few hundred header mutants, none of which may abort the process -------------------

FUZZ_SEEDS = 200

_DRIVER = r"""
import json, random, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from ggufmutate import mutant, read_layout, write_layout
import localinfer
from localinfer.errors import LocalInferError, exit_code_for

base = read_layout(Path(sys.argv[2]))
out = Path(sys.argv[3])
counts = {"refused_by_header": 0, "refused_after_probe": 0, "aborted_in_child": 0, "loaded": 0}
for seed in range(int(sys.argv[4])):
    layout, what = mutant(base, random.Random(seed))
    path = write_layout(layout, out / f"m{seed}.gguf", sparse=True)
    print(f"seed {seed}: {what[:120]}", file=sys.stderr, flush=True)  # the last line names the culprit
    try:
        from localinfer.gguf import read_gguf
        read_gguf(path)
    except LocalInferError:
        counts["refused_by_header"] += 1
        path.unlink()
        continue
    try:  # what every command does: resolve (header, template, probe) then load and decode here
        with localinfer.load(str(path), n_ctx=256, n_threads=1) as model:
            model.generate("Hi", max_tokens=1, temperature=0)
        counts["loaded"] += 1
    except LocalInferError as exc:
        key = "aborted_in_child" if "llama.cpp aborted loading this file" in str(exc) else "refused_after_probe"
        counts[key] += 1
    path.unlink()
print(json.dumps(counts))
"""


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ~120 of the mutants reach the probe (a child each): ~2 min on a quiet 2-core box
def test_fuzzed_header_mutants_never_abort_the_process(smollm2_path, tmp_path) -> None:
    """The mutants the header checks refuse cost milliseconds; the rest are probed (one child each)
    and, when proven, loaded and run in this driver's own process, which must never die."""
    tests_dir = str(Path(__file__).resolve().parent)
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, tests_dir, str(smollm2_path), str(tmp_path), str(FUZZ_SEEDS)],
        capture_output=True, text=True, timeout=1700,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]  # 134: an abort; the last "seed N" line names it
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    print(counts)
    assert sum(counts.values()) == FUZZ_SEEDS
    assert counts["refused_by_header"] > 0 and counts["loaded"] > 0  # both paths were taken
    assert counts["aborted_in_child"] > 0  # mutants llama.cpp aborts on were met, and survived


def test_the_engine_version_is_read_beside_the_bindings_without_importlib_metadata() -> None:
    # every run checks its model's verdict against it: importlib.metadata would cost ~16 ms of the start
    from importlib.metadata import version

    from conftest import run_python

    code = ("import sys; from localinfer.engine.probe import engine_version; "
            "print(engine_version()); print('importlib.metadata' in sys.modules)")  # fmt: skip
    assert run_python(code).stdout.splitlines() == [f"llama-cpp-python {version('llama_cpp_python')}", "False"]


_SPY = """
import subprocess, sys
children = []
spawn = subprocess.Popen.__init__
def spy(self, args, *rest, **kw):
    children.append(" ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args))
    spawn(self, args, *rest, **kw)
subprocess.Popen.__init__ = spy
from localinfer.cli.main import main
sys.argv = ["localinfer", "run", "--raw", "-m", sys.argv[1], "-n", "2", "-c", "256", "-q", "-p", "hi"]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
print("CHILDREN", children, file=sys.stderr)
print("MODULES", sorted(m for m in ("importlib.metadata", "socket", "secrets", "jinja2") if m in sys.modules), file=sys.stderr)
"""


@pytest.mark.slow
def test_a_run_of_a_proven_file_starts_no_probe_and_imports_nothing_it_does_not_use(smollm2_path) -> None:
    from conftest import run_python

    def run() -> tuple[str, str]:
        err = run_python(_SPY, str(smollm2_path)).stderr.splitlines()
        return next(x for x in err if x.startswith("CHILDREN")), next(x for x in err if x.startswith("MODULES"))

    first, _ = run()
    assert "localinfer.engine.probe" in first and first.count("', '") == 0, first  # proven once, in a child
    # then known: no child, and nothing a plain completion does not need (no template compiled again)
    assert run() == ("CHILDREN []", "MODULES []")
