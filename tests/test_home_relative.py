"""A relative LOCALINFER_HOME is refused (exit 2), not resolved against each working directory."""

from __future__ import annotations

import pytest
from conftest import run_cli


def test_a_relative_home_is_refused_and_nothing_is_created(tmp_path) -> None:
    proc = run_cli("list", env={"LOCALINFER_HOME": "rel/store"}, cwd=tmp_path)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    error, hint = err.splitlines()
    assert error == "Error: LOCALINFER_HOME=rel/store is a relative path: it would mean another folder in each working directory"
    assert hint == f"  hint: set it to an absolute path, such as LOCALINFER_HOME={tmp_path / 'rel' / 'store'}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.llama
def test_doctor_reports_a_relative_home(tmp_path) -> None:
    proc = run_cli("doctor", env={"LOCALINFER_HOME": "store"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    assert "LOCALINFER_HOME=store is a relative path" in proc.stdout.decode() + proc.stderr.decode()


def test_a_home_under_the_user_folder_is_absolute(tmp_path) -> None:
    proc = run_cli("list", env={"LOCALINFER_HOME": "~/store", "HOME": str(tmp_path)}, cwd="/")
    assert proc.returncode == 0, proc.stderr.decode()
