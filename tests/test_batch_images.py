"""Batch lines naming image files (``file://`` URLs in ``image_url`` parts, read under ``--image-dir``;
localinfer.batch.images): each bad path is its line's error, the other lines go on. No model: what the
lines become (tests/test_vision.py runs one such job on the real libmtmd)."""

from __future__ import annotations

import base64
import json

import pytest
from projector import png
from typer.testing import CliRunner

from localinfer.batch.io import parse_input
from localinfer.request.images import MARKER, from_bytes
from localinfer.request.request import BatchRequest, InputError


def line(i: int, *urls: str) -> str:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return json.dumps({"id": i, "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "what is it?"}]}]})


@pytest.fixture
def pics(tmp_path):
    d = tmp_path / "pics"
    (d / "sub").mkdir(parents=True)
    (d / "a.png").write_bytes(png(1))
    (d / "sub" / "b.png").write_bytes(png(2))
    (d / "notes.png").write_text("not an image")
    (tmp_path / "secret.png").write_bytes(png(3))
    (d / "out.png").symlink_to(tmp_path / "secret.png")
    (d / "in.png").symlink_to(d / "sub" / "b.png")  # a link that stays inside is fine
    return d


def test_file_urls_under_the_image_dir_become_the_lines_images(pics):
    (item,) = parse_input(line(1, "file://a.png", "file://sub/b.png", "file://in.png") + "\n", "jsonl", image_dir=pics)
    assert isinstance(item, BatchRequest), item
    (msg,) = item.messages
    assert msg["content"] == MARKER * 3 + "what is it?"
    assert [im.rgb for im in msg["images"]] == [from_bytes(p, "x").rgb for p in (png(1), png(2), png(2))]
    assert msg["images"][1].sha256 == from_bytes(png(2), "x").sha256  # the file's bytes: the cache knows it again
    absolute = parse_input(line(2, f"file://{pics / 'a.png'}"), "jsonl", image_dir=pics)[0]
    assert isinstance(absolute, BatchRequest)  # an absolute path inside DIR is inside


def test_a_path_outside_the_dir_fails_its_line_only(pics, tmp_path):
    lines = [line(0, "file://a.png"), line(1, "file://../secret.png"), line(2, "file://out.png"),
             line(3, f"file://{tmp_path / 'secret.png'}"), line(4, "file://notes.png"), line(5, "file://nope.png"),
             line(6, "file://sub"), line(7, "file://sub/../a.png"), line(8, *["file://a.png"] * 17)]  # fmt: skip
    items = parse_input("\n".join(lines), "jsonl", image_dir=pics)
    assert [type(i).__name__ for i in items] == ["BatchRequest"] + ["InputError"] * 6 + ["BatchRequest", "InputError"]
    reasons = {i.id: i.reason for i in items if isinstance(i, InputError)}
    for rid in (1, 2, 3):
        assert "is outside --image-dir" in reasons[rid] and "messages[0].content[0].image_url" in reasons[rid], reasons[rid]
    assert "notes.png is not an image" in reasons[4]
    assert "cannot read nope.png" in reasons[5] and "sub is not a file" in reasons[6]
    assert "17 image files" in reasons[8]
    assert all("\n" not in r for r in reasons.values())


def test_without_an_image_dir_file_urls_are_refused_saying_what_to_pass(pics):
    ok, refused = parse_input(line(0, "data:image/png;base64," + base64.b64encode(png(1)).decode())
                              + "\n" + line(1, "file://a.png"), "jsonl")  # fmt: skip
    assert isinstance(ok, BatchRequest) and isinstance(refused, InputError)
    assert "pass --image-dir DIR" in refused.reason and refused.id == 1


@pytest.mark.llama  # the batch command touches llama.cpp before it reads its input (as test_batch.py's)
def test_the_cli_refuses_an_image_dir_that_is_not_one(tmp_path):
    from localinfer.cli.main import build_app

    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(line(0, "file://a.png") + "\n")
    r = CliRunner().invoke(build_app(), ["batch", str(jobs), "--image-dir", str(tmp_path / "nope")], catch_exceptions=False)
    assert r.exit_code == 2 and "is not a directory" in r.stderr
