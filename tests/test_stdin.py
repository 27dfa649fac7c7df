"""Piped stdin is checked like every other input: UTF-8 or exit 2 naming the byte; no more read than
a context can hold (refused before it is all read and tokenized, or only its end kept with
--on-overflow truncate); chat's piped turns line by line, the same way."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from conftest import run_cli
from localinfer.cli.main import build_app


def invoke(*args: str, input: bytes):
    return CliRunner().invoke(build_app(), list(args), input=input)


@pytest.mark.parametrize(
    ("data", "needle"),
    [(b"caf\xe9", "byte 0xe9 at byte offset 3"), (b"ok \xff\xfe\x00binary", "byte 0xff at byte offset 3")],
)
@pytest.mark.llama
def test_run_refuses_piped_bytes_that_are_not_utf8(data: bytes, needle: str) -> None:
    proc = run_cli("run", "-p", "summarise", input=data, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert proc.stdout == b""
    error, hint = err.splitlines()
    assert error == f"Error: the input on stdin is not valid UTF-8 ({needle})"
    assert hint.startswith("  hint: pass UTF-8 text")


@pytest.mark.llama
def test_run_refuses_input_far_beyond_the_context_before_reading_it_all() -> None:
    """98 MB once took 69 s and 8.7 GB to tokenize before the context check refused it."""
    big = b"word " * ((20 << 20) // 5)  # 20 MiB
    proc = run_cli("run", "-p", "summarise", input=big, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 6, err  # the context does not hold it, as for a prompt found too long
    assert err.splitlines()[0] == (
        "Error: the input on stdin is larger than 128 KiB, more than a 4096-token context can hold "
        "(at 32 bytes a token); not reading the rest"
    )
    bigger = run_cli("run", "-c", "8192", "-p", "summarise", input=big, timeout=120)
    assert "larger than 256 KiB, more than a 8192-token context" in bigger.stderr.decode()


@pytest.mark.llama
def test_piped_text_within_the_bound_reaches_the_model_intact(fake_engine, smollm2_path) -> None:  # noqa: F811
    text = ("café " + "x" * 995 + "\n") * 150  # 150 KiB: over the default bound, under -c 8192's
    r = invoke("run", "-m", str(smollm2_path), "-c", "8192", "-p", "summarise", input=text.encode())
    assert r.exit_code == 0, r.stderr
    seen = fake_engine.texts[-1]
    assert "café x" in seen and "\ufffd" not in seen and seen.count("café") == 150


@pytest.mark.llama
def test_truncate_keeps_the_end_of_an_input_beyond_the_bound(fake_engine, smollm2_path) -> None:  # noqa: F811
    data = b"START " + b"a " * (1 << 20) + b"END"  # 2 MiB
    r = invoke("run", "-m", str(smollm2_path), "--on-overflow", "truncate", "-p", "summarise", input=data)
    assert r.exit_code == 0, r.stderr
    seen = fake_engine.texts[-1]
    assert "END" in seen and "START" not in seen


@pytest.mark.slow
def test_chat_refuses_a_piped_line_that_is_not_utf8(smollm2_path) -> None:
    proc = run_cli("chat", "-m", str(smollm2_path), "-q", "-n", "2", "--temperature", "0", input=b"hi\ncaf\xe9 au lait\n")
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert proc.stdout.strip()  # the first turn was answered
    assert "Error: line 2 of the input on stdin is not valid UTF-8 (byte 0xe9 at byte offset 3)" in err


@pytest.mark.slow
def test_chat_refuses_a_piped_line_longer_than_the_bound(smollm2_path) -> None:
    proc = run_cli("chat", "-m", str(smollm2_path), "-q", "-n", "2", input=b"x" * (5 << 20) + b"\n")
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "Error: line 1 of the input on stdin is longer than 4 MiB; not reading the rest" in err
    assert proc.stdout == b""
