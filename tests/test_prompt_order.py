"""The prompt keeps the order it was sent in: a system turn among the messages is rendered where it
is (SmolLM2's real template takes it anywhere), or, where a template refuses it or leaves it out, as
a user turn's text beside it; either way the prompt of a session's turn starts with the last turn's
(the cached prefix is reused). Claude Code's billing-header block, which changes every request,
never reaches the prompt unless LOCALINFER_KEEP_BILLING_HEADER=1 asks for it."""

from __future__ import annotations

from typing import Any

import pytest

from localinfer.engine.templates import ChatTemplate
from localinfer.serve.wires import anthropic
AGENTS = "Available agent types: general-purpose, Explore, Plan."


def _billing(cch: str) -> dict[str, str]:
    return {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.197.417; cc_entrypoint=sdk-cli; cch={cch};"}


def _claude(messages: list[dict[str, Any]], cch: str) -> list[dict[str, Any]]:
    """What Claude Code's default mode sends, as serve's messages."""
    body = {"max_tokens": 8, "messages": messages,
            "system": [_billing(cch), {"type": "text", "text": "You are Claude Code."}, {"type": "text", "text": " Be brief."}]}  # fmt: skip
    return list(anthropic.parse(body).request.messages)


@pytest.fixture(scope="module")
def smollm2(smollm2_path) -> ChatTemplate:
    from localinfer.gguf.checks import read_gguf

    return ChatTemplate(source="gguf", template=read_gguf(smollm2_path).chat_template)


def test_a_system_turn_among_the_messages_stays_where_it_was_sent(smollm2):
    # Claude Code: a user turn, then a system turn (its mid-conversation-system beta); the next turn
    # appends the answer and a question, a later one another system turn: each prompt starts with the last
    turns = [[{"role": "user", "content": "q1"}, {"role": "system", "content": AGENTS}]]
    turns.append([*turns[-1], {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}])
    turns.append([*turns[-1], {"role": "assistant", "content": "a2"}, {"role": "system", "content": "Now in plan mode."},
                  {"role": "user", "content": "q3"}])  # fmt: skip
    prompts = [smollm2.render(_claude(t, cch=f"{i:05x}")).text for i, t in enumerate(turns)]
    for before, after in zip(prompts, prompts[1:]):
        assert after.startswith(before)
    assert prompts[0].index("You are Claude Code. Be brief.") < prompts[0].index("q1") < prompts[0].index(AGENTS)
    assert prompts[2].index("a2") < prompts[2].index("Now in plan mode.") < prompts[2].index("q3")


def test_the_billing_header_never_reaches_the_prompt_unless_asked(smollm2, monkeypatch):
    ask = [{"role": "user", "content": "hi"}]
    prompt = smollm2.render(_claude(ask, cch="abcde")).text
    assert "billing" not in prompt and "cch=" not in prompt and "You are Claude Code. Be brief." in prompt
    assert anthropic.parse({"max_tokens": 8, "messages": ask, "system": [_billing("x")]}).request.messages[0]["role"] == "user"
    monkeypatch.setenv(anthropic.KEEP_BILLING_ENV, "1")
    assert "cch=abcde" in smollm2.render(_claude(ask, cch="abcde")).text


FIRST_ONLY = (  # a system message anywhere but first is refused (as some models' templates do)
    "{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
    "{% if loop.index0 > 0 and m['role'] != 'system' and m['role'] == messages[loop.index0 - 1]['role'] %}"
    "{{ raise_exception('Conversation roles must alternate') }}{% endif %}"
    "<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}<assistant>"
)
DROPS = (  # only the first system message is written; a later one is left out without a word
    "{% if messages[0]['role'] == 'system' %}[{{ messages[0]['content'] }}]{% endif %}"
    "{% for m in messages %}{% if m['role'] != 'system' %}<{{ m['role'] }}>{{ m['content'] }}{% endif %}{% endfor %}<assistant>"
)


@pytest.mark.parametrize("template", [FIRST_ONLY, DROPS], ids=["refuses", "drops"])
def test_a_template_that_cannot_take_it_there_gets_it_as_user_text_and_the_prefix_holds(template):
    t = ChatTemplate(source="gguf", template=template)
    turns = [[{"role": "system", "content": "S."}, {"role": "user", "content": "q1"}, {"role": "system", "content": AGENTS}]]
    turns.append([*turns[-1], {"role": "assistant", "content": "a1"}, {"role": "system", "content": "Mode."},
                  {"role": "user", "content": "q2"}])  # fmt: skip
    prompts = [t.render(m).text for m in turns]
    assert prompts[1].startswith(prompts[0]) and AGENTS in prompts[0] and "Mode." in prompts[1]
    assert prompts[1].index("a1") < prompts[1].index("Mode.") < prompts[1].index("q2")
    assert f"<user>q1\n\n{AGENTS}" in prompts[0] and "<user>Mode.\n\nq2" in prompts[1]  # roles still alternate
