"""Inputs without bounds (issue 22): what is read from a file a user names, a batch line, nesting."""

from __future__ import annotations

import io

import pytest

from localinfer.errors import UsageError
from localinfer.request.limits import loads, read_limited


def test_an_endless_stream_is_read_only_up_to_its_limit():
    class Endless(io.RawIOBase):
        def readable(self):
            return True

        def readinto(self, b):
            b[:] = bytes(len(b))
            return len(b)

    with pytest.raises(UsageError, match="larger than 1 MiB"):
        read_limited(io.BufferedReader(Endless()), 1 << 20, "/dev/zero")
    assert read_limited(io.BytesIO(b"abc"), 3, "x") == b"abc"


def test_json_nested_beyond_what_python_parses_is_bad_json_not_a_recursion_error():
    with pytest.raises(ValueError, match="nested too deeply"):
        loads("[" * 200_000 + "]" * 200_000, "chat.json")


def test_a_huge_or_deeply_nested_batch_line_is_one_error_record_and_the_rest_run(monkeypatch):
    from localinfer.batch import io as batch_io
    from localinfer.batch.io import BATCH_LINE_MAX_BYTES, BatchRequest, InputError, parse_input

    huge = b'{"prompt": "' + b"x" * (BATCH_LINE_MAX_BYTES + 1) + b'"}'
    deep = b'{"prompt": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    parsed: list[int] = []  # the lengths of the lines handed to the JSON parser
    real_loads = batch_io.json.loads
    monkeypatch.setattr(batch_io.json, "loads", lambda s, *a, **k: parsed.append(len(s)) or real_loads(s, *a, **k))
    items = parse_input(b"\n".join([huge, deep, b'{"prompt": "hi"}']), "jsonl")
    assert parsed == [len(deep), 16]  # the huge line is refused by its length, never parsed
    assert isinstance(items[0], InputError) and "a request may take" in items[0].reason
    assert isinstance(items[1], InputError) and "nested too deeply" in items[1].reason
    assert isinstance(items[2], BatchRequest) and items[2].prompt == "hi"


@pytest.mark.slow
def test_chat_load_of_dev_zero_or_nested_brackets_is_an_error_and_the_chat_goes_on(smollm2_path, tmp_path):
    from conftest import run_cli

    nested = tmp_path / "nested.json"
    nested.write_text("[" * 200_000 + "]" * 200_000)
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as fh:  # sparse: a regular file as endless as /dev/zero, within what is read
        fh.truncate(1 << 30)
    script = f"/load /dev/zero\n/load {huge}\n/load {nested}\n/set max_tokens 2\nhi\n"
    proc = run_cli("chat", "-m", str(smollm2_path), "-t", "1", input=script, timeout=120)
    err = proc.stderr.decode()
    assert "cannot read /dev/zero: it is a device" in err  # not read at all (a FIFO would block)
    assert f"{huge} is larger than 16 MiB" in err and "nested too deeply" in err
    assert "Set max_tokens = 2." in err and proc.stdout.strip() and "Traceback" not in err
    assert proc.returncode == 2
