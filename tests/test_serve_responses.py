"""OpenAI's Responses API on a real `localinfer serve` (SmolLM2), driven by the official ``openai``
SDK (responses.create, stream, parse with pydantic) and the ``openai-agents`` SDK (a plain run and a
run whose function tool the SDK executes). Stateless: previous_response_id is a clear 400. With a
135M model the assertions are on the protocol, not on the answer's wisdom (calls are forced)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_serve_model import ServeProcess

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")
jsonschema = pytest.importorskip("jsonschema")

ADD = {"type": "function", "name": "add", "description": "Add two integers", "strict": True,
       "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 1000},
                                                       "b": {"type": "integer", "minimum": 0, "maximum": 1000}},
                      "required": ["a", "b"], "additionalProperties": False}}  # fmt: skip
ASK = "Name three colours."


@pytest.fixture(scope="module")
def served(smollm2_path, tmp_path_factory):
    with ServeProcess(smollm2_path, "-np", "2", "-c", "1024", "-t", "1", home=tmp_path_factory.mktemp("serve-home")) as s:
        yield s


def _client(s: ServeProcess) -> Any:
    return openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=600)


def test_create_and_greedy_text_equal_to_chat_completions(served):
    c = _client(served)
    r = c.responses.create(model="smollm2", input=ASK, instructions="Be brief.", max_output_tokens=24, temperature=0)
    chat = c.chat.completions.create(model="smollm2", max_tokens=24, temperature=0,
                                     messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": ASK}])  # fmt: skip
    assert r.object == "response" and r.id.startswith("resp_") and r.status in ("completed", "incomplete")
    assert r.output_text == chat.choices[0].message.content and r.output[0].type == "message"
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == chat.usage.completion_tokens
    cut = c.responses.create(model="smollm2", input=ASK, max_output_tokens=2)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"


def test_stream_events_are_numbered_and_assemble_to_the_response(served):
    c = _client(served)
    items = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
             {"type": "message", "role": "user", "id": "m1", "content": [{"type": "input_text", "text": ASK}]}]  # fmt: skip
    kw: dict[str, Any] = {"model": "smollm2", "input": items, "max_output_tokens": 20, "temperature": 0}
    events = list(c.responses.create(stream=True, **kw))
    whole = c.responses.create(**kw)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] in ("response.completed", "response.incomplete")
    assert kinds.index("response.output_item.added") < kinds.index("response.output_text.delta") < kinds.index("response.output_item.done")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert done.text == text
    with c.responses.stream(**kw) as stream:
        final = stream.get_final_response()
    assert final.output_text == text


def test_parse_with_pydantic(served):
    class Colour(pydantic.BaseModel):  # bounded: a 135M model would write an unbounded list until the cap
        name: str = pydantic.Field(max_length=20)
        warm: bool

    r = _client(served).responses.parse(model="smollm2", input="Describe the colour red as JSON.", text_format=Colour,
                                        max_output_tokens=200, temperature=0)  # fmt: skip
    assert isinstance(r.output_parsed, Colour) and r.status == "completed"


def test_function_calls_forced_streamed_and_answered(served):
    c = _client(served)
    kw: dict[str, Any] = {"model": "smollm2", "input": "What is 17 plus 25?", "tools": [ADD], "tool_choice": "required",
                          "max_output_tokens": 96, "temperature": 0}  # fmt: skip
    r = c.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and r.status == "completed"
    import json

    for call in calls:
        jsonschema.validate(json.loads(call.arguments), ADD["parameters"])
    # the stream against the same request evaluated alike: a prompt found whole in the cache has its
    # last token evaluated alone, whose logits differ from a batch's in the last bits (llama.cpp's CPU
    # attention: SmolLM2 parts "17" from "1" here on some CPUs), so the request is made once more first
    again = c.responses.create(**kw)
    calls = [o for o in again.output if o.type == "function_call"]
    events = list(c.responses.create(stream=True, **kw))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert calls and args == calls[0].arguments + "".join(x.arguments for x in calls[1:])
    turn = [{"role": "user", "content": "What is 17 plus 25?"},
            {"type": "function_call", "call_id": calls[0].call_id, "name": "add", "arguments": calls[0].arguments},
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "42"}]  # fmt: skip
    after = c.responses.create(model="smollm2", input=turn, tools=[ADD], max_output_tokens=16)
    assert after.status in ("completed", "incomplete") and after.usage.input_tokens > r.usage.input_tokens


def test_what_codex_sends_is_accepted_and_state_is_refused(served):
    c = _client(served)
    r = c.responses.create(
        model="gpt-5-codex", input=[{"type": "message", "role": "user", "id": "x", "content": [{"type": "input_text", "text": "hi"}]}],
        tools=[{"type": "web_search"}, ADD], tool_choice="auto", parallel_tool_calls=False, store=False,
        reasoning={"effort": "low", "summary": "auto"}, include=["reasoning.encrypted_content"], prompt_cache_key="k",
        stream=False, max_output_tokens=8, extra_body={"client_metadata": {"a": "b"}},
    )  # fmt: skip
    assert r.object == "response"
    with pytest.raises(openai.BadRequestError) as info:
        c.responses.create(model="m", input="hi", previous_response_id="resp_1")
    assert "stateless" in info.value.body["message"] and info.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError, match="file_search"):
        c.responses.create(model="m", input="hi", tools=[{"type": "file_search", "vector_store_ids": ["v"]}])
    status, metrics = served.request("GET", "/metrics")[0], served.request("GET", "/metrics")[2].decode()
    assert status == 200 and 'endpoint="responses",status="200"' in metrics and 'endpoint="responses",status="400"' in metrics


def test_the_agents_sdk_runs_plain_and_with_a_tool(served):
    agents = pytest.importorskip("agents")
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool

    client = openai.AsyncOpenAI(base_url=served.base + "/v1", api_key="unused", max_retries=0)
    model = OpenAIResponsesModel(model="smollm2", openai_client=client)
    agents.set_tracing_disabled(True)
    calls: list[tuple[int, int]] = []

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    async def main() -> tuple[Any, Any]:
        plain = Agent(name="plain", instructions="Be brief.", model=model, model_settings=ModelSettings(max_tokens=256, temperature=0))
        first = await Runner.run(plain, "Say hi.")
        tooled = Agent(name="adder", instructions="Use the add tool.", model=model, tools=[add],
                       model_settings=ModelSettings(tool_choice="add", max_tokens=256, temperature=0),
                       tool_use_behavior="stop_on_first_tool")  # fmt: skip
        second = await Runner.run(tooled, "What is 17 plus 25?", max_turns=3)
        return first, second

    first, second = asyncio.run(main())
    assert isinstance(first.final_output, str)
    assert calls and all(isinstance(a, int) and isinstance(b, int) for a, b in calls)  # the SDK ran the tool
    kinds = [item.type for item in second.new_items]
    assert "tool_call_item" in kinds and "tool_call_output_item" in kinds
    assert str(second.final_output) == str(sum(calls[0]))  # the tool's own result ends the run (stop_on_first_tool)
