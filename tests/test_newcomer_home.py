"""A LOCALINFER_HOME localinfer cannot use (under a file, read-only) is one error line with a hint and
exit 2 for every command that keeps files, not an internal error from deep in the store."""

from __future__ import annotations

import pytest
from conftest import run_cli
from typer.testing import CliRunner

from localinfer.cli.main import build_app

HINT = "hint: set LOCALINFER_HOME to a folder you can write"


@pytest.mark.parametrize("args", [["run", "-n", "1", "-p", "hi"], ["list"], ["pull", "smollm2:135m"], ["stats"]])
@pytest.mark.llama
def test_a_home_under_a_file(tmp_path, args):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    home = blocker / "home"
    proc = run_cli(*args, env={"LOCALINFER_HOME": str(home)}, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.splitlines() == [f"Error: LOCALINFER_HOME={home} cannot be used: {blocker} is a file, not a folder", "  " + HINT]
    assert proc.stdout == b""


@pytest.mark.parametrize("below", [False, True], ids=["the-folder", "a-folder-to-create-in-it"])
@pytest.mark.llama
def test_a_read_only_home(read_only_dir, monkeypatch, below):
    home = read_only_dir / "home" if below else read_only_dir
    monkeypatch.setenv("LOCALINFER_HOME", str(home))
    for args in (["run", "-n", "1", "-p", "hi"], ["list"]):
        result = CliRunner().invoke(build_app(), args)
        assert result.exit_code == 2, result.output
        assert f"Error: LOCALINFER_HOME={home} cannot be used: {read_only_dir} is not writable\n  {HINT}\n" == result.output


def test_a_home_another_process_creates_meanwhile_is_a_folder(tmp_path, monkeypatch):
    """Several commands start at once with a new home (the history's concurrent-writers test): one
    looks, finds nothing, and another creates the folder before the second look. Forced here: the
    folder appears between the first ``is_dir`` and ``exists``."""
    from pathlib import Path

    from localinfer import paths

    home = tmp_path / "home"
    real_is_dir, looks = Path.is_dir, []

    def is_dir_then_create(self: Path) -> bool:
        answer = real_is_dir(self)
        if self == home and not looks:
            looks.append(self)
            self.mkdir()  # the other process, right after this one looked
        return answer

    monkeypatch.setattr(Path, "is_dir", is_dir_then_create)
    assert paths.data_dir_problem(home) is None and looks == [home]
