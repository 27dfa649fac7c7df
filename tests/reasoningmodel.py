"""A reasoning model for tests, made from SmolLM2's GGUF: its weights with a DeepSeek-R1-Distill-style
chat template (ChatML, which SmolLM2 was trained on, whose generation prompt opens ``<think>\\n``),
so what the model writes up to a ``</think>`` is its thinking. No reasoning model's weights are small
enough to ship with the tests; the splitting is the template's business, not the weights'."""

from __future__ import annotations

import struct
from pathlib import Path

from ggufmutate import T_STRING, read_layout, write_layout

# A few turns that show the model how an answer ends its thinking (SmolLM2 copies the pattern).
FEW_SHOT = [
    ("What is the capital of France?", "The user asks about France.", "Paris."),
    ("What is the capital of Italy?", "The user asks about Italy.", "Rome."),
    ("What is the capital of Spain?", "The user asks about Spain.", "Madrid."),
]
_SHOTS = "".join(
    f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n<think>\n{t}\n</think>\n\n{a}<|im_end|>\n" for q, t, a in FEW_SHOT
)

# ChatML, as SmolLM2's own template, after the few-shot turns (written as text by the template, so
# that `run -p` gets them too); past answers keep their thinking, and the generation prompt opens
# it, as DeepSeek-R1-Distill's does.
R1_CHATML = (
    "{{ " + repr(_SHOTS) + " }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' and message.get('reasoning_content') %}"
    "{{ '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' }}"
    "{% endif %}"
    "{{ message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)

# Qwen3's switch: enable_thinking=false closes an empty thinking block in the generation prompt.
QWEN3_CHATML = R1_CHATML.replace(
    "{{ '<|im_start|>assistant\\n<think>\\n' }}",
    "{{ '<|im_start|>assistant\\n' }}{% if enable_thinking is defined and not enable_thinking %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% else %}{{ '<think>\\n' }}{% endif %}",
)


def with_template(source: Path, template: str, path: Path) -> Path:
    """``source``'s GGUF with ``template`` as its chat template (written once per path)."""
    if path.is_file():
        return path
    layout = read_layout(source)
    raw = template.encode()
    i = layout.index("tokenizer.chat_template")
    layout.kvs[i] = (b"tokenizer.chat_template", T_STRING, struct.pack("<Q", len(raw)) + raw)
    return write_layout(layout, path)
