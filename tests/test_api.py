"""The library API on the real SmolLM2 model: the README's example as written, streaming, chat,
and the errors a Python user meets."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.llama]

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readmes_python_example_runs_as_written():
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## From Python") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    stats = re.search(r"^(\d+\.\d+) (\d+\.\d+)$", proc.stdout, re.M)
    assert stats and float(stats.group(1)) > 0 and float(stats.group(2)) > 0
    reply, finish, n = proc.stdout.strip().splitlines()[-1].rsplit(" ", 2)
    assert finish in ("stop", "length") and 0 < int(n) <= 32


@pytest.fixture(scope="module")
def model():
    import localinfer

    with localinfer.load("smollm2:135m", n_ctx=512, n_threads=2) as m:
        yield m


def test_stream_yields_the_text_then_one_last_chunk_with_the_stats(model):
    chunks = list(model.stream("Count from 1 to 5.", max_tokens=12, temperature=0))
    *pieces, last = chunks
    assert pieces and all(c.text and c.stats is None for c in pieces)
    assert last.text == "" and last.stats is not None and last.result is not None
    assert last.result.text == "".join(c.text for c in pieces)
    assert last.stats.completion_tokens <= 12 and last.stats.prompt_tokens > 0


def test_generate_is_the_stream_gathered_and_greedy_is_repeatable(model):
    first = model.generate("Name a colour.", max_tokens=8, temperature=0)
    again = "".join(c.text for c in model.stream("Name a colour.", max_tokens=8, temperature=0))
    assert first.text == again and first.finish_reason in ("stop", "length")


def test_chat_takes_a_conversation_and_reuses_the_cache_for_its_next_turn(model):
    turn = [{"role": "user", "content": "My name is Ada. Say OK."}]
    reply = model.chat(turn, max_tokens=6, temperature=0)
    turn += [{"role": "assistant", "content": reply.text}, {"role": "user", "content": "What is my name?"}]
    second = model.chat(turn, max_tokens=8, temperature=0)
    assert second.stats.cached_tokens > 0


def test_a_string_given_to_chat_is_a_usage_error(model):
    import localinfer

    with pytest.raises(localinfer.LocalInferError, match="list of messages"):
        model.chat("hi")


def test_an_unknown_model_is_a_clear_error_without_loading_anything():
    import localinfer
    from localinfer.errors import ModelNotFoundError

    with pytest.raises(ModelNotFoundError):
        localinfer.load("./no-such-model.gguf")
