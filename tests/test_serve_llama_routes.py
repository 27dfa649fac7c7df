"""llama-server's endpoints (/tokenize, /detokenize, /apply-template, /props, the input_tokens counts)
through the ASGI app with a scripted engine: their shapes, errors, key, bound and the router's model."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("starlette")

from test_serve import HI, FakeEngine, _state, call

from localinfer.engine.templates import ChatTemplate
from localinfer.serve.http.app import ServerState
from localinfer.serve.config import ServeConfig
from localinfer.serve.scheduler.worker import Prepared
from localinfer.serve.wires.llama import template_caps

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")  # fmt: skip
TOOLS = ("{% if tools %}<tools>{% for t in tools %}{{ t['function']['name'] }} {% endfor %}</tools>{% endif %}"
         "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
         "<{{ m['role'] }}>{{ m['content'] }}{% for c in m.get('tool_calls') or [] %}<call>{{ c['function']['name'] }}</call>"
         "{% endfor %}{% endfor %}<think></think>")  # fmt: skip


class CharVocab:
    """One token per character (its code point + 1); 0 is BOS, written ``<s>``."""

    n_vocab = 0x110001

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return [0] * add_special + [ord(c) + 1 for c in text]

    def token_bytes(self, token: int) -> bytes:
        return b"<s>" if token == 0 else chr(token - 1).encode()


class TemplateEngine(FakeEngine):
    """FakeEngine whose prepare renders the chat template and tokenizes it, as serve.scheduler.prepare does."""

    def __init__(self, template: str = CHATML, **kw: Any) -> None:
        super().__init__(**kw)
        self.loaded = SimpleNamespace(model=CharVocab(), template=ChatTemplate("gguf", template), projector=None)
        self.prepared: list[Any] = []

    def prepare(self, request: Any, clamp: bool = False) -> Prepared:
        text = self.loaded.template.render(list(request.request.messages)).text
        self.prepared.append((request, clamp))
        return Prepared(request, [0, *self.loaded.model.tokenize(text, add_special=False)], ())


def _json(state: Any, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
    status, _, data = call(state, method, path, body, **kw)
    return status, json.loads(data)


def test_tokenize_and_detokenize_round_trip_with_pieces():
    state = _state(TemplateEngine())
    assert _json(state, "POST", "/tokenize", {"content": "hé"}) == (200, {"tokens": [ord("h") + 1, ord("é") + 1]})
    status, got = _json(state, "POST", "/tokenize", {"content": "hé", "add_special": True, "with_pieces": True})
    assert status == 200 and got["tokens"] == [{"id": 0, "piece": "<s>"}, {"id": 105, "piece": "h"}, {"id": 234, "piece": "é"}]
    assert _json(state, "POST", "/detokenize", {"tokens": [0, 105, 234]}) == (200, {"content": "<s>hé"})
    assert _json(state, "POST", "/detokenize", {"tokens": []}) == (200, {"content": ""})


def test_a_piece_that_is_not_whole_utf8_is_its_bytes():
    engine = TemplateEngine()
    engine.loaded.model.token_bytes = lambda t: b"\xc3" if t == 7 else b"x"
    engine.loaded.model.tokenize = lambda text, **_: [7, 8]
    assert _json(_state(engine), "POST", "/tokenize", {"content": "é", "with_pieces": True})[1]["tokens"] == [
        {"id": 7, "piece": [0xC3]}, {"id": 8, "piece": "x"}]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {}, "content"),
        ("/tokenize", {"content": 3}, "content"),
        ("/tokenize", {"content": "x", "with_pieces": "yes"}, "with_pieces"),
        ("/tokenize", {"content": "x", "extra": 1}, "extra"),
        ("/detokenize", {"tokens": "12"}, "tokens"),
        ("/detokenize", {"tokens": [1, True]}, "tokens"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/detokenize", {"tokens": [0x110001]}, "tokens"),
        ("/apply-template", {}, "messages"),
        ("/v1/chat/completions/input_tokens", {"messages": HI, "n": 2}, "n"),
        ("/v1/responses/input_tokens", {}, "input"),
    ],
)
def test_bad_bodies_are_a_400_naming_the_field(path, body, param):
    status, got = _json(_state(TemplateEngine()), "POST", path, body)
    assert status == 400 and got["error"]["param"] == param, got


def test_apply_template_is_the_prompt_the_chat_request_evaluates():
    engine = TemplateEngine()
    state = _state(engine)
    body = {"messages": [{"role": "system", "content": "Be brief."}, *HI], "max_tokens": 100000, "temperature": 0}
    status, got = _json(state, "POST", "/apply-template", body)
    assert status == 200
    assert got["prompt"] == "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    # prepared as a chat request is, the prompt alone checked against the context (max_tokens lowered)
    assert engine.prepared[-1][1] is True and engine.prepared[-1][0].request.messages[0]["content"] == "Be brief."
    counted = _json(state, "POST", "/v1/chat/completions/input_tokens", body)
    assert counted == (200, {"object": "chat.completion.input_tokens", "input_tokens": len(got["prompt"]) - 2})


def test_responses_input_tokens_has_openais_shape():
    state = _state(TemplateEngine())
    status, got = _json(state, "POST", "/v1/responses/input_tokens", {"input": "hi", "instructions": "Be brief."})
    prompt = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert status == 200 and got == {"object": "response.input_tokens", "input_tokens": 1 + len(prompt)}


def test_props_says_the_context_slots_model_name_template_and_modalities():
    status, got = _json(_state(TemplateEngine()), "GET", "/props")
    assert status == 200
    assert got["default_generation_settings"]["n_ctx"] == FakeEngine.n_ctx_seq and got["total_slots"] == FakeEngine.parallel
    assert got["model_path"] == got["model_alias"] == "m"  # the model's name, never a path on disk
    assert got["chat_template"] == CHATML and got["modalities"] == {"vision": False, "audio": False}
    assert got["chat_template_caps"]["supports_system_role"] is True and got["chat_template_caps"]["supports_tools"] is False
    assert got["build_info"].startswith("localinfer-")


def test_template_caps_are_what_the_template_renders():
    assert template_caps(ChatTemplate("gguf", TOOLS)) == {
        "supports_system_role": False, "supports_tools": True, "supports_tool_calls": True,
        "supports_parallel_tool_calls": True, "supports_thinking": True}  # fmt: skip
    assert not any(template_caps(None).values())


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("POST", "/tokenize", {"content": "x"}), ("POST", "/detokenize", {"tokens": [1]}), ("GET", "/props", None),
     ("POST", "/apply-template", {"messages": HI}), ("POST", "/v1/chat/completions/input_tokens", {"messages": HI}),
     ("POST", "/v1/responses/input_tokens", {"input": "x"}), ("POST", "/v1/messages/count_tokens", {"messages": HI})],
)  # fmt: skip
def test_each_route_takes_the_key_the_loading_and_the_bound(method, path, body):
    keyed = _state(TemplateEngine(), api_key="k")
    status, got = _json(keyed, method, path, body)
    assert status == 401 and "error" in got
    assert _json(keyed, method, path, body, headers={"Authorization": "Bearer k"})[0] == 200
    status, _, _ = call(_state(None), method, path, body)
    assert status == 503  # the model is loading
    busy = _state(TemplateEngine(), max_queue=2)
    busy.preparing = 2  # --max-queue requests are rendering or tokenizing already
    status, headers, data = call(busy, method, path, body)
    assert status == 503 and headers["retry-after"] == "1" and b"overloaded" in data  # each in its own shape
    assert busy.preparing == 2


def test_a_model_field_picks_the_routers_model():
    asked: list[Any] = []
    engine = TemplateEngine()

    class Models:
        async def pick(self, scope: Any, name: str | None, **_: Any) -> Any:
            from localinfer.serve.models.multi import Picked

            asked.append(name)
            return Picked(engine, name or "recent")  # type: ignore[arg-type]

    state = _state(None)
    state.models = Models()  # type: ignore[assignment]
    assert _json(state, "POST", "/tokenize", {"content": "x", "model": "gemma3"})[0] == 200
    assert _json(state, "POST", "/apply-template", {"messages": HI, "model": "smollm2"})[0] == 200
    assert _json(state, "GET", "/props")[1]["model_path"] == "recent"  # none named: the router's choice
    status, got = _json(state, "GET", "/props?model=qwen")
    assert status == 200 and got["model_alias"] == "qwen"
    assert asked == ["gemma3", "smollm2", None, "qwen"]


def test_the_guard_refuses_a_web_page_on_these_routes():
    status, got = _json(_state(TemplateEngine()), "POST", "/tokenize", {"content": "x"}, headers={"Origin": "http://evil.example"})
    assert status == 403 and got["error"]["code"] == "origin_not_allowed"


def test_props_names_a_model_file_without_its_folders():
    state = ServerState.holding(ServeConfig(), ("/home/someone/models/x.Q4.gguf", "x.Q4.gguf"), TemplateEngine())  # type: ignore[arg-type]
    got = _json(state, "GET", "/props")[1]
    assert got["model_path"] == got["model_alias"] == "x.Q4.gguf"
