"""One preparation of a request for every entry (generate.prepare): the tool plan made once, the
engine's one job type for a single sequence as for the batch, serve's two limits of max_tokens in
its one preparation, and the resident server's wires given to its app. No model: a vocabulary of
characters and a ChatML template stand in for it."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from localinfer.engine.templates import ChatTemplate
from localinfer.engine.types import GenerationStats, SeqJob, Step
from localinfer.request import request as rq
from localinfer.request.sampling import SamplingOptions

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")  # fmt: skip
TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


class Chars:
    """One token per character (its code point + 1); 0 is BOS."""

    n_vocab, n_ctx, n_ctx_train = 0x110001, 4096, 8192

    def __init__(self, answer: tuple[str, ...] = ("Hi", "!")) -> None:
        self.answer, self.jobs = answer, []

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return [0] * add_special + [ord(c) + 1 for c in text]

    def detokenize(self, tokens: list[int]) -> str:
        return "".join(chr(t - 1) for t in tokens if t > 0)

    def token_text(self, token: int) -> str:
        return "<s>" if token == 0 else chr(token - 1)

    def run(self, job: SeqJob, stats: GenerationStats) -> Iterator[Step]:
        self.jobs.append(job)
        stats.prompt_tokens, stats.finish_reason = len(job.tokens), "stop"
        for i, piece in enumerate(self.answer):
            stats.completion_tokens = i + 1
            yield Step(piece, i)


def _loaded(answer: tuple[str, ...] = ("Hi", "!")) -> Any:
    return SimpleNamespace(model=Chars(answer), template=ChatTemplate("gguf", CHATML), projector=None, plan=None,
                           name="chars", buffers=None)  # fmt: skip


def test_a_request_is_prepared_once_its_tools_planned_once(monkeypatch):
    from localinfer.generate.prepare import prepare
    from localinfer.request.toolcalls import plan

    planned = []
    real = plan.plan_for
    monkeypatch.setattr(plan, "plan_for", lambda *a: planned.append(a) or real(*a))
    request = rq.build(messages=[{"role": "user", "content": "weather in Oslo?"}], tools=[TOOL], stop=["END"],
                       max_tokens=7, sampling=SamplingOptions(temperature=0.0), logprobs=2)  # fmt: skip
    prepared = prepare(_loaded(), request)
    assert len(planned) == 1 and prepared.tools is not None and prepared.tools.offered
    job = prepared.job(3)
    assert (job.key, list(job.tokens), job.max_tokens, job.logprobs) == (3, list(prepared.tokens), 7, 2)
    assert job.stop[0] == "END" and set(prepared.stop) <= set(job.stop)  # the request's and the template's
    assert (job.constraint, job.constraint_after) == prepared.constraint
    assert "weather" in _loaded().model.detokenize(list(prepared.tokens))  # the tools went through the template


def test_run_hands_the_single_sequence_the_batch_engines_job():
    from localinfer.generate.run import Generation

    loaded = _loaded()
    request = rq.build("hello", raw=True, default_max_tokens=5, stop=["x"], ignore_eos=True)
    gen = Generation(loaded, request)
    assert "".join(gen) == "Hi!" and gen.result.text == "Hi!"
    (job,) = loaded.model.jobs
    assert isinstance(job, SeqJob) and (job.max_tokens, job.stop, job.ignore_eos) == (5, ("x",), True)
    assert loaded.model.detokenize(list(job.tokens)) == "hello"


PROMPT = "The sea is calm today"
ROOM = 256 - (len(PROMPT) + 1)  # what the prompt (and its BOS) leaves of a 256-token sequence


@pytest.mark.llama  # serve's preparation imports the engine's constraint compiler (llama.cpp)
@pytest.mark.parametrize(("asked", "clamp", "cap", "expected"), [
    (None, False, 5, 5),  # serve's -n: the cap of an answer whose request names none
    (None, False, 10_000, ROOM),  # within what the prompt leaves
    (100, False, 5, 100),  # the request's own limit wins
    (10_000, True, 5, ROOM),  # a clamping wire lowers the request's to what is left
    (None, False, -1, None),  # no cap: what the context leaves
])  # fmt: skip
def test_serves_preparation_holds_both_limits_of_max_tokens(asked, clamp, cap, expected):
    from localinfer.serve.scheduler.prepare import prepare
    from localinfer.serve.wires.openai import Envelope

    envelope = Envelope(rq.build(PROMPT, raw=True, max_tokens=asked))
    prepared = prepare(_loaded(), 256, {}, envelope, clamp=clamp, n_predict=cap)
    assert len(prepared.tokens) == 256 - ROOM and prepared.asked.request.raw_text == PROMPT  # asked: the Envelope
    assert prepared.request.max_tokens == expected and prepared.job().max_tokens == expected


def test_the_resident_servers_wires_are_given_to_its_app_and_carry_what_our_cli_reads():
    from starlette.testclient import TestClient

    from localinfer.errors import ContextOverflowError
    from localinfer.serve.config import ServeConfig
    from localinfer.serve.http.app import ServerState, create_app
    from localinfer.serve.wires import catalog
    from localinfer.serve.wires.openai import ApiError

    class Overflowing:
        n_ctx_seq, parallel, running, queued, cells_used, cells_total, prompt_cache = 64, 1, 0, 0, 0, 64, None

        def prepare(self, request: Any, clamp: bool = False) -> Any:
            raise ApiError(400, "too long", code="context_length_exceeded", cause=ContextOverflowError("too long", hint="shorten it"))

    for completions, whole in ((None, False), (catalog.WHOLE, True)):
        state = ServerState.holding(ServeConfig(), ("m", "m.gguf"), Overflowing())  # type: ignore[arg-type]
        client = TestClient(create_app(state, completions=completions), base_url="http://127.0.0.1:8080")
        for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}), ("/v1/completions", {"prompt": "hi"})):
            r = client.post(path, json=body)
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
            assert r.json().get("localinfer") == ({"type": "ContextOverflowError", "message": "too long", "hint": "shorten it"} if whole else None)
