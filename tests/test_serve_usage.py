"""Usage in each wire's own convention on a real `localinfer serve` (SmolLM2, one sequence, so a
follow-up finds its prefix cached), read by the official clients: Anthropic's ``input_tokens`` is the
uncached part beside ``cache_read_input_tokens`` (streamed and not), OpenAI's ``prompt_tokens`` the
whole prompt with ``prompt_tokens_details.cached_tokens``, the Responses API's
``input_tokens_details.cached_tokens``, Ollama's ``prompt_eval_count`` the whole prompt (as Ollama's
runner counts it), and /metrics the cached tokens."""

from __future__ import annotations

import re
from typing import Any

import pytest
from test_serve_model import ServeProcess

pytestmark = pytest.mark.slow
anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
ollama = pytest.importorskip("ollama")

SYSTEM = "You are a careful assistant. " * 20  # a prefix worth caching
FIRST = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def served(smollm2_path, tmp_path_factory):
    with ServeProcess(smollm2_path, "-np", "1", "-c", "2048", "-t", "1", home=tmp_path_factory.mktemp("usage-home")) as s:
        yield s


def _then(answer: str) -> list[dict[str, Any]]:
    return [*FIRST, {"role": "assistant", "content": answer}, {"role": "user", "content": "And another one?"}]


def _cached_total(s: ServeProcess) -> int:
    _, _, text = s.request("GET", "/metrics")
    return int(re.search(rb"^localinfer_prompt_tokens_cached_total (\d+)", text, re.M).group(1))


def test_anthropic_reports_the_cached_part_apart_streamed_and_not(served):
    c = anthropic.Anthropic(base_url=served.base, api_key="x", max_retries=0, timeout=300)
    kw: dict[str, Any] = {"model": "smollm2", "max_tokens": 8, "system": SYSTEM, "extra_body": {"temperature": 0}}
    first = c.messages.create(messages=FIRST, **kw)
    turns = _then("".join(b.text for b in first.content if b.type == "text"))
    whole = c.messages.count_tokens(model="smollm2", system=SYSTEM, messages=turns).input_tokens
    again = c.messages.create(messages=turns, **kw)
    u = again.usage
    assert u.cache_read_input_tokens > whole // 2 and u.input_tokens + u.cache_read_input_tokens == whole
    with c.messages.stream(messages=turns, **kw) as stream:
        start = next(e for e in stream if e.type == "message_start").message.usage
        final = stream.get_final_message().usage
    # the same prompt a third time: all of it cached but what the engine evaluates again to sample
    assert start.cache_read_input_tokens > whole // 2 and start.input_tokens + start.cache_read_input_tokens == whole
    assert (final.input_tokens, final.cache_read_input_tokens) == (start.input_tokens, start.cache_read_input_tokens)


def test_openai_responses_ollama_and_metrics_count_the_cached_tokens(served):
    chat = openai.OpenAI(base_url=served.base + "/v1", api_key="x", max_retries=0, timeout=300)
    system = [{"role": "system", "content": SYSTEM}]
    first = chat.chat.completions.create(model="smollm2", messages=[*system, *FIRST], max_tokens=8, temperature=0)
    turns = [*system, *_then(first.choices[0].message.content or "")]
    before = _cached_total(served)
    stream = chat.chat.completions.create(model="smollm2", messages=turns, max_tokens=8, temperature=0, stream=True,
                                          stream_options={"include_usage": True})  # fmt: skip
    usage = [c.usage for c in stream if c.usage is not None][-1]
    whole, cached = usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens
    assert whole // 2 < cached < whole and _cached_total(served) - before == cached
    r = chat.responses.create(model="smollm2", input=turns, max_output_tokens=16, temperature=0)  # the same prompt again
    assert r.usage.input_tokens == whole and whole // 2 < r.usage.input_tokens_details.cached_tokens < whole
    o = ollama.Client(host=served.base, timeout=300).chat(model="smollm2", messages=turns, options={"num_predict": 4, "temperature": 0})
    assert o.prompt_eval_count == whole  # Ollama's: the whole prompt, cached or not
