"""The one request builder (localinfer.request.request.build) every command, the API and serve go through."""

from __future__ import annotations

import pytest

from localinfer.request.sampling import SamplingOptions
from localinfer.errors import UsageError
from localinfer.request.request import build


def test_a_prompt_is_a_user_message_after_the_system_prompt():
    r = build("Hi", system="Be brief.", max_tokens=4, stop=["\n"], sampling=SamplingOptions(temperature=0.0))
    assert r.messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"})
    assert r.raw_text is None and r.mode == "chat" and r.max_tokens == 4 and r.stop == ("\n",)
    assert r.sampling.greedy and r.default_max_tokens is None


def test_plain_completion_puts_the_system_prompt_before_the_text():
    r = build("Once upon", system="A fairy tale.", raw=True, default_max_tokens=256)
    assert r.raw_text == "A fairy tale.\n\nOnce upon" and r.messages == () and r.mode == "raw"
    assert r.default_max_tokens == 256
    assert build("Once upon", raw=True).raw_text == "Once upon"


def test_messages_are_used_as_given_and_the_system_prompt_is_for_a_prompt():
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    r = build(messages=msgs, system="ignored", default_max_tokens=256)
    assert r.messages == tuple(msgs) and r.default_max_tokens is None


def test_text_that_is_not_utf8_is_refused_before_anything_runs():
    with pytest.raises(UsageError, match="the system prompt is not valid UTF-8"):
        build("hi", system="bad \udcff")
    with pytest.raises(UsageError, match="the prompt is not valid UTF-8"):
        build("bad \udcff", raw=True)


def test_a_backend_without_a_chat_template_refuses_messages_and_completes_prompts(fake_backend):  # noqa: F811
    from fakebackend import FakeBackend

    backend = FakeBackend(fake_backend, "base-model")
    fake_backend.can_chat = False
    with pytest.raises(UsageError, match="base-model has no chat template"):
        backend.request([{"role": "user", "content": "hi"}])
    assert backend.request("hi", system="s").raw_text == "s\n\nhi"

