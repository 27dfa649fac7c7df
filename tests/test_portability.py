"""No platform broken by an import: every module of the package imports with the POSIX-only modules
gone (as on Windows), and what reads /proc or /sys, or needs resource, falls back when they are not there."""

from __future__ import annotations

import json

import pytest
from conftest import run_python

pytestmark = pytest.mark.llama  # the children import the engine and ask llama.cpp about the build

POSIX_ONLY = ("fcntl", "resource", "termios", "tty", "pty", "pwd", "grp")

_BLOCK = f"""
import sys
for name in {POSIX_ONLY!r}:
    sys.modules[name] = None  # "import fcntl" now raises ImportError, as where it does not exist
"""


def test_every_module_imports_without_the_posix_only_modules():
    code = _BLOCK + """
import importlib, json, pkgutil, localinfer
failed, names = [], ["localinfer"]
names += [m.name for m in pkgutil.walk_packages(localinfer.__path__, "localinfer.") if m.name != "localinfer.__main__"]
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
print(json.dumps({"imported": len(names), "failed": failed}))
"""
    out = json.loads(run_python(code).stdout)
    assert out["failed"] == [] and out["imported"] > 60


def test_machine_facts_fall_back_without_proc_sys_and_resource():
    # psutil first: on Linux it needs resource itself, and on each OS it reads the machine its own way
    code = "import psutil\n" + _BLOCK + """
import builtins, contextlib, glob, json, pathlib

@contextlib.contextmanager
def no_proc_or_sys():
    # Linux's pseudo-files disappear for our own code, as on macOS or Windows (psutil, which reads
    # each OS its own way, still sees them)
    real_open, real_read, real_glob = builtins.open, pathlib.Path.read_text, glob.glob
    def gone(path):
        ours = sys._getframe(2).f_globals.get("__name__", "").startswith("localinfer")
        return ours and str(path).startswith(("/proc", "/sys"))
    def open_(file, *a, **k):
        if gone(file):
            raise FileNotFoundError(2, "No such file or directory", str(file))
        return real_open(file, *a, **k)
    def read_text(self, *a, **k):
        if gone(self):
            raise FileNotFoundError(2, "No such file or directory", str(self))
        return real_read(self, *a, **k)
    def glob_(pattern, *a, **k):
        return [] if gone(pattern) else real_glob(pattern, *a, **k)
    builtins.open, pathlib.Path.read_text, glob.glob = open_, read_text, glob_
    try:
        yield
    finally:
        builtins.open, pathlib.Path.read_text, glob.glob = real_open, real_read, real_glob

from localinfer import paths
from localinfer.engine import backend
from localinfer.generate.run import peak_rss_bytes
from localinfer.system import hardware

with no_proc_or_sys():
    facts = {
        "cpu_model": hardware.cpu_model(),
        "cgroup_room": hardware._cgroup_room(),
        "proc_meminfo": hardware._proc_meminfo(),
        "sysfs_cores": backend._sysfs_physical_cores(),
        "boot_id": paths.boot_id(),
        "threads": backend.default_threads(),
        "memory": hardware.memory(),
        "peak_rss": peak_rss_bytes(),
    }
print(json.dumps(facts))
"""
    facts = json.loads(run_python(code).stdout)
    assert facts["cpu_model"]
    assert facts["cgroup_room"] is facts["proc_meminfo"] is facts["sysfs_cores"] is facts["boot_id"] is None
    assert facts["threads"] >= 1 and facts["peak_rss"] > 0
    assert facts["memory"]["total_bytes"] >= facts["memory"]["available_bytes"] > 0
