"""Model output written as JSON never holds NaN or Infinity (which strict parsers refuse): serve's
bodies and chunks, `embed`'s lines, `run --json` and batch's records write them as null."""

from __future__ import annotations

import json
import math

import pytest

from localinfer.embed import embedding
from localinfer.batch import io as batch_io
from localinfer.serve.wires import chat_completions as responses
def strict(text: str):
    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("dumps", [responses.dumps, embedding.dumps], ids=["serve", "embed"])
def test_non_finite_floats_are_written_as_null(dumps):
    body = {"embedding": [0.5, math.nan, -math.inf], "logprobs": {"content": [{"logprob": math.inf, "top": (1.0, math.nan)}]}}
    got = strict(dumps(body))
    assert got == {"embedding": [0.5, None, None], "logprobs": {"content": [{"logprob": None, "top": [1.0, None]}]}}
    assert strict(dumps({"x": 1.25, "y": "NaN"})) == {"x": 1.25, "y": "NaN"}, "finite numbers and strings untouched"


def test_serve_chunks_hold_no_nan():
    assert b"NaN" not in responses.sse({"choices": [{"logprobs": {"content": [{"logprob": math.nan}]}}]})


def test_batch_records_hold_no_nan(tmp_path):
    out = tmp_path / "out.jsonl"
    batch_io.JsonlSink(path=out)({"id": 1, "logprobs": [{"token": "a", "logprob": math.nan}]})
    assert strict(out.read_text()) == {"id": 1, "logprobs": [{"token": "a", "logprob": None}]}
