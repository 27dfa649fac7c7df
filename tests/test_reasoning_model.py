"""A real reasoning model end to end: SmolLM2's weights with a DeepSeek-R1-Distill-style template
(tests/reasoningmodel.py: its generation prompt opens <think>, a few shots teach the model to close
it) and a Qwen3-style one (enable_thinking). The thinking is apart everywhere: `run | cat`, --json,
batch lines, chat, and serve's reasoning_content through the official openai client."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import run_cli
from reasoningmodel import QWEN3_CHATML, R1_CHATML, with_template

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of Germany?"
THOUGHT, ANSWER = "The user asks about Germany.", "Berlin."
GREEDY = ("--temperature", "0", "-n", "40", "-t", "1", "--no-log", "--offline")


@pytest.fixture(scope="module")
def r1(smollm2_path, tmp_path_factory):
    return with_template(smollm2_path, R1_CHATML, tmp_path_factory.mktemp("r1") / "smollm2-r1.gguf")


@pytest.fixture(scope="module")
def qwen3(smollm2_path, tmp_path_factory):
    return with_template(smollm2_path, QWEN3_CHATML, tmp_path_factory.mktemp("qwen3") / "smollm2-qwen3.gguf")


def test_run_piped_through_cat_prints_only_the_answer(r1):
    cmd = [sys.executable, "-m", "localinfer", "run", "-m", str(r1), *GREEDY, "-p", QUESTION]
    proc = subprocess.run(" ".join(f"'{c}'" for c in cmd) + " | cat", shell=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode() == ANSWER + "\n"
    assert b"think" not in proc.stdout and THOUGHT.encode() not in proc.stderr  # stderr is no terminal either


def test_run_json_holds_the_reasoning_and_show_prompt_the_prompt(r1):
    proc = run_cli("run", "-m", str(r1), *GREEDY, "--json", "--show-prompt", "-p", QUESTION)
    assert proc.returncode == 0, proc.stderr.decode()
    out = json.loads(proc.stdout)
    assert (out["reasoning"], out["text"]) == (THOUGHT, ANSWER)
    usage, timings = out["usage"], out["timings"]
    assert 0 < usage["reasoning_tokens"] < usage["completion_tokens"]
    assert timings["reasoning_ttft_ms"] <= timings["ttft_ms"]  # TTFT is the first answer text
    err = proc.stderr.decode()
    assert f"--- prompt ({usage['prompt_tokens']} tokens) ---" in err
    assert f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n<think>\n\n--- end of prompt ---" in err


def test_no_think_builds_the_closed_prompt_and_the_answer_has_no_thinking(qwen3):
    proc = run_cli("run", "-m", str(qwen3), *GREEDY, "--json", "--no-think", "--show-prompt", "-p", QUESTION)
    assert proc.returncode == 0, proc.stderr.decode()
    assert "<|im_start|>assistant\n<think>\n\n</think>\n\n\n--- end of prompt ---" in proc.stderr.decode()
    out = json.loads(proc.stdout)
    # the prompt closed the thinking: what the model writes is all answer (this one still copies its shots)
    assert out["reasoning"] is None and out["usage"]["reasoning_tokens"] == 0 and out["text"]
    thinking = json.loads(run_cli("run", "-m", str(qwen3), *GREEDY, "--json", "--think", "-p", QUESTION).stdout)
    assert (thinking["reasoning"], thinking["text"]) == (THOUGHT, ANSWER)


def test_batch_lines_and_chat_keep_the_thinking_out_of_the_answer(r1, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": 1, "prompt": QUESTION}) + "\n" + json.dumps({"id": 2, "prompt": "What is the capital of Japan?"}) + "\n")
    proc = run_cli("batch", "-m", str(r1), "--offline", "--no-log", "-q", "--temperature", "0", "-n", "40", str(src))
    assert proc.returncode == 0, proc.stderr.decode()
    lines = {d["id"]: d for d in map(json.loads, proc.stdout.decode().splitlines())}
    assert (lines[1]["reasoning"], lines[1]["text"]) == (THOUGHT, ANSWER)
    assert (lines[2]["reasoning"], lines[2]["text"]) == ("The user asks about Japan.", "Tokyo.")
    assert 0 < lines[1]["usage"]["reasoning_tokens"] < lines[1]["usage"]["completion_tokens"]
    chat = run_cli("chat", "-m", str(r1), *GREEDY, input=f"{QUESTION}\nWhat is the capital of Japan?\n")
    assert chat.returncode == 0, chat.stderr.decode()
    assert chat.stdout.decode() == "Berlin.\nTokyo.\n"


def test_the_api_streams_thinking_first_and_keeps_it_inline_when_asked(r1):
    import localinfer

    with localinfer.load(str(r1), n_ctx=1024, n_threads=1) as m:
        chunks = list(m.stream(QUESTION, temperature=0, max_tokens=40))
        thought = "".join(c.reasoning for c in chunks)
        text = "".join(c.text for c in chunks)
        assert (thought, text) == (THOUGHT, ANSWER)
        first_text = next(i for i, c in enumerate(chunks) if c.text)
        assert all(not c.reasoning for c in chunks[first_text:])  # thinking comes first
        inline = m.generate(QUESTION, temperature=0, max_tokens=40, reasoning_format="none")
        assert inline.reasoning is None and inline.text == f"{THOUGHT}\n</think>\n\n{ANSWER}"


# -- serve ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(qwen3, tmp_path_factory):
    """The Qwen3-style model, told by default not to think (a request's chat_template_kwargs win)."""
    from test_serve_model import ServeProcess

    args = ("-np", "2", "-c", "1024", "-t", "1", "--chat-template-kwargs", '{"enable_thinking": false}')
    with ServeProcess(qwen3, *args, home=tmp_path_factory.mktemp("serve-home")) as s:
        yield s


def _client(s):
    import openai

    return openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=120)


THINK = {"chat_template_kwargs": {"enable_thinking": True}}
ASK = {"model": "m", "messages": [{"role": "user", "content": QUESTION}], "temperature": 0, "max_tokens": 40}


def test_serve_reasoning_content_with_the_openai_client(server):
    c = _client(server)
    r = c.chat.completions.create(**ASK, extra_body=THINK)
    message = r.choices[0].message
    assert message.content == ANSWER and "think" not in message.content
    assert message.model_extra["reasoning_content"] == THOUGHT and message.model_extra["reasoning"] == THOUGHT
    assert 0 < r.usage.completion_tokens_details.reasoning_tokens < r.usage.completion_tokens

    plain = c.chat.completions.create(**ASK)  # the server's default: enable_thinking false
    assert "reasoning_content" not in (plain.choices[0].message.model_extra or {})
    assert plain.usage.completion_tokens_details.reasoning_tokens == 0

    inline = c.chat.completions.create(**ASK, extra_body={**THINK, "reasoning_format": "none"})
    assert inline.choices[0].message.content == f"{THOUGHT}\n</think>\n\n{ANSWER}"


def test_serve_streams_reasoning_deltas_that_assemble_to_the_whole(server):
    c = _client(server)
    thought, text, order = [], [], []
    for chunk in c.chat.completions.create(**ASK, extra_body=THINK, stream=True, stream_options={"include_usage": True}):
        if not chunk.choices:
            assert chunk.usage.completion_tokens_details.reasoning_tokens > 0
            continue
        delta = chunk.choices[0].delta
        extra = delta.model_extra or {}
        if extra.get("reasoning_content"):
            thought.append(extra["reasoning_content"])
            order.append("reasoning")
        if delta.content:
            text.append(delta.content)
            order.append("text")
    assert ("".join(thought), "".join(text)) == (THOUGHT, ANSWER)
    assert order.index("text") > max(i for i, k in enumerate(order) if k == "reasoning")
    assert len(thought) > 1  # streamed as it was generated, not at the end


def test_serve_refuses_bad_template_kwargs_and_reasoning_format(server):
    for body, param in (({"chat_template_kwargs": "x"}, "chat_template_kwargs"),
                        ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs"),
                        ({"reasoning_format": "loud"}, "reasoning_format")):  # fmt: skip
        status, out = server.json("POST", "/v1/chat/completions", {**ASK, **body})
        assert status == 400 and out["error"]["param"] == param, out


def test_run_with_endpoint_sends_the_variables_and_reads_the_servers_reasoning(server):
    args = ("run", "--endpoint", server.base + "/v1", "--json", "--no-log", "--temperature", "0", "-n", "40", "-p", QUESTION)
    out = json.loads(run_cli(*args, "--think").stdout)
    assert (out["reasoning"], out["text"]) == (THOUGHT, ANSWER)
    assert 0 < out["usage"]["reasoning_tokens"] < out["usage"]["completion_tokens"]
    plain = json.loads(run_cli(*args).stdout)  # the server's default: no thinking
    assert plain["reasoning"] is None
