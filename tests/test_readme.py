"""The README's quick start says what a newcomer must do and what CI does, exactly; the manual in
docs/ is reachable from it."""

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


def _slug(heading: str) -> str:
    # GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_the_readme_is_short_and_the_manual_is_in_docs():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 300
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert len(pages) >= 8
    for page in pages:  # a heading, then one paragraph saying what the page covers
        head = page.read_text(encoding="utf-8").split("\n\n")
        assert head[0].startswith("# ") and "\n" not in head[0] and not head[1].startswith(("#", "```", "-", "|", ">")), page.name


def test_every_link_of_the_readme_and_the_docs_leads_somewhere():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.is_file(), (page.name, target)
            assert not anchor or anchor in _anchors(dest), (page.name, target)


def test_the_docs_the_code_points_to_exist():
    for source in (ROOT / "src").rglob("*.py"):
        for name in re.findall(r"(?<![\w/`])docs/([\w-]+\.md)", source.read_text(encoding="utf-8")):
            assert (ROOT / "docs" / name).is_file(), (source.name, name)
    assert "README" not in "".join(p.read_text(encoding="utf-8") for p in (ROOT / "src").rglob("*.py"))
