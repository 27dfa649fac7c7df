"""Failures of the machine a user can meet anywhere, each one line and a meaningful exit code
(issue 22): a full disk, a folder that cannot be written."""

from __future__ import annotations

import errno

import pytest

from typer.testing import CliRunner

from localinfer.cli.main import build_app


def _disk_full(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device", "/store/partial/gemma-3-270m.gguf")


@pytest.mark.llama
def test_a_full_disk_while_assembling_a_packaged_model_exits_6(monkeypatch):
    from localinfer.store.sources import packages

    monkeypatch.setattr(packages, "assemble_into", _disk_full)
    res = CliRunner().invoke(build_app(), ["run", "-m", "gemma3:270m", "-p", "hi", "-n", "1"])
    assert res.exit_code == 6, res.output
    assert "the disk is full writing /store/partial/gemma-3-270m.gguf" in res.stderr
    assert "internal error" not in res.stderr and len(res.stderr.strip().splitlines()) == 2


@pytest.mark.llama
def test_a_folder_that_cannot_be_written_is_a_usage_error(monkeypatch):
    from localinfer.store.sources import packages

    def read_only(*_args, **_kwargs):
        raise OSError(errno.EROFS, "Read-only file system", "/store/partial/x.gguf")

    monkeypatch.setattr(packages, "assemble_into", read_only)
    res = CliRunner().invoke(build_app(), ["run", "-m", "gemma3:270m", "-p", "hi", "-n", "1"])
    assert res.exit_code == 2 and "cannot write /store/partial/x.gguf: Read-only file system" in res.stderr


@pytest.mark.llama
def test_typos_get_one_suggestion_style_for_commands_models_and_settings():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "localinfer", "rn", "-p", "hi"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr == "Error: no such command 'rn'\n  hint: did you mean run?\n"
    res = CliRunner().invoke(build_app(), ["run", "-m", "smolm2:135m", "-p", "hi", "--offline"])
    assert res.exit_code == 3 and "did you mean smollm2:135m" in res.stderr

    from localinfer.chat.settings import ChatSettings
    from localinfer.errors import UsageError

    try:
        ChatSettings().with_value("max_tokns", "2")
    except UsageError as exc:
        assert exc.hint == "did you mean max_tokens?"
    else:
        raise AssertionError("an unknown setting was accepted")


def test_registry_names_are_case_insensitive():
    from localinfer.store.names import parse_spec

    assert parse_spec("Smollm2:135M").name == "smollm2:135m"
