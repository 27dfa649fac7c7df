"""Real templates of popular models render exactly as transformers' ``apply_chat_template`` does
(through ``render_jinja_template``, what it calls to render: transformers installs without torch),
with and without the template variables they read (``enable_thinking``, ``reasoning_effort``); and
each reasoning family's markers are found in its own template."""

from __future__ import annotations

from typing import Any

import pytest
from templatesource import real_template

from localinfer.engine.templates import ChatTemplate
from localinfer.errors import LocalInferError
from localinfer.request import reasoning

transformers_utils = pytest.importorskip("transformers.utils.chat_template_utils")

# name in llama.cpp's models/templates -> the BOS and EOS texts its GGUF gives (as Model.bos_text does)
TEMPLATES = {
    "Qwen-Qwen3-0.6B": ("", "<|im_end|>"),
    "Qwen-QwQ-32B": ("", "<|im_end|>"),
    "Qwen-Qwen2.5-7B-Instruct": ("", "<|im_end|>"),
    "HuggingFaceTB-SmolLM3-3B": ("", "<|im_end|>"),
    "GLM-4.6": ("", "<|endoftext|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "openai-gpt-oss-120b": ("<|startoftext|>", "<|return|>"),
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.3-70B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
    "Mistral-Small-3.2-24B-Instruct-2506": ("<s>", "</s>"),
    "google-gemma-2-2b-it": ("<bos>", "<eos>"),
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "ibm-granite-granite-3.3-2B-Instruct": ("<|end_of_text|>", "<|end_of_text|>"),
    "ibm-granite-granite-4.0": ("<|end_of_text|>", "<|end_of_text|>"),
    "ByteDance-Seed-OSS": ("<seed:bos>", "<seed:eos>"),
    "NVIDIA-Nemotron-Nano-v2": ("<SPECIAL_10>", "<SPECIAL_11>"),
    "MiniMax-M2": ("", "[e~["),
}

CONVERSATIONS = {
    "one turn": [{"role": "user", "content": "What is 2+2?"}],
    "system and history": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Name a prime number, \"quoted\" & <tagged>."},
    ],
    "past thinking": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."},
        {"role": "user", "content": "And 3+3?"},
    ],
}


def _variants(template: str) -> list[dict[str, Any]]:
    """No variables, and each value of those the template reads."""
    out: list[dict[str, Any]] = [{}]
    if "enable_thinking" in template:
        out += [{"enable_thinking": False}, {"enable_thinking": True}]
    if "reasoning_effort" in template:
        out += [{"reasoning_effort": "high"}]
    return out


def _transformers(template: str, messages: list[dict[str, Any]], bos: str, eos: str, variables: dict[str, Any]) -> str:
    rendered, _ = transformers_utils.render_jinja_template(
        conversations=[messages], chat_template=template, add_generation_prompt=True,
        bos_token=bos, eos_token=eos, **variables,
    )  # fmt: skip
    return rendered[0]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_real_template_renders_as_transformers(name: str) -> None:
    template = real_template(name)
    bos, eos = TEMPLATES[name]
    ours = ChatTemplate(source="gguf", template=template, bos_text=bos, eos_text=eos)
    compared = 0
    for what, messages in CONVERSATIONS.items():
        for variables in _variants(template):
            try:
                expected = _transformers(template, [dict(m) for m in messages], bos, eos, variables)
            except Exception as exc:  # the template refuses this conversation: so must we
                with pytest.raises(LocalInferError):
                    ours.render([dict(m) for m in messages], **variables)
                assert type(exc).__name__ in ("TemplateError", "ValueError", "TypeError", "UndefinedError", "TemplateRuntimeError"), exc
                continue
            got = ours.render([dict(m) for m in messages], **variables).text
            assert got == expected, f"{name}, {what}, {variables}"
            compared += 1
    assert compared >= 2, f"{name}: fewer than two conversations rendered at all"


def test_enable_thinking_false_builds_what_transformers_builds_for_no_thinking() -> None:
    """The issue's example: Qwen3's "no thinking" prompt closes an empty thinking block."""
    template = real_template("Qwen-Qwen3-0.6B")
    ours = ChatTemplate(source="gguf", template=template, eos_text="<|im_end|>")
    messages = [{"role": "user", "content": "Hi"}]
    off = ours.render(messages, enable_thinking=False).text
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert ours.render(messages).text.endswith("<|im_start|>assistant\n")
    assert off == _transformers(template, messages, "", "<|im_end|>", {"enable_thinking": False})


@pytest.mark.parametrize(
    ("name", "open_", "opened"),
    [
        ("Qwen-Qwen3-0.6B", "<think>", False),
        ("Qwen-QwQ-32B", "<think>", True),  # its generation prompt opens the thinking
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "<think>", True),
        ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "<think>", True),
        ("HuggingFaceTB-SmolLM3-3B", "<think>", False),
        ("GLM-4.6", "<think>", False),
        ("MiniMax-M2", "<think>", True),
        ("ByteDance-Seed-OSS", "<seed:think>", False),
        ("openai-gpt-oss-120b", "<|channel|>analysis<|message|>", False),
        ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "<|START_THINKING|>", False),
        ("mistralai-Ministral-3-14B-Reasoning-2512", "[THINK]", False),
    ],
)
def test_reasoning_markers_found_in_each_familys_template(name: str, open_: str, opened: bool) -> None:
    template = real_template(name)
    markers = reasoning.detect(template)
    assert markers is not None and markers.open == open_
    # llama.cpp's copies of some templates read enable_thinking, which llama-server always passes
    prompt = ChatTemplate(source="gguf", template=template).render([{"role": "user", "content": "Hi"}], enable_thinking=True).text
    assert reasoning.opened_by(markers, prompt) is opened


@pytest.mark.parametrize("name", ["Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct", "google-gemma-2-2b-it"])
def test_templates_without_thinking_have_no_markers(name: str) -> None:
    assert reasoning.detect(real_template(name)) is None
