"""The README's quick start says what a newcomer must do and what CI does, exactly."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _quick_start() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text[text.index("## Quick start") : text.index("\n## ", text.index("## Quick start") + 1)]


def test_the_quick_start_clones_cds_and_makes_a_venv_before_installing():
    commands = re.findall(r"```bash\n(.*?)```", _quick_start(), re.S)[0].splitlines()
    first_pip = next(i for i, c in enumerate(commands) if "pip install" in c)
    before = "\n".join(commands[:first_pip + 1])
    assert re.search(r"git clone \S.* && cd localinfer", before) and "python3 -m venv .venv && . .venv/bin/activate" in before


def test_the_test_command_is_the_one_ci_runs_and_what_else_ci_does_is_said():
    quick = _quick_start()
    line = re.findall(r"```bash\n(.*?)\n```", quick, re.S)[1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert line in ci.splitlines()  # the same command, not a paraphrase
    # what else .ci/run does, and the words the README says it with
    for step, said in (("--upgrade pip", "upgrading pip"), ("benchmarks/build_native.sh", "benchmarks/build_native.sh"),
                       (".ci/rpc", ".ci/rpc"), ("python3 -m venv .venv", "fresh `.venv`")):  # fmt: skip
        assert step in ci and said in quick, step
