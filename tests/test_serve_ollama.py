"""Ollama's API on a real `localinfer serve`, driven by the official ``ollama`` client and by
langchain-ollama's ``ChatOllama``: list, show, ps, chat and generate (whole and streamed), embed,
format (a JSON schema the answer validates against), tools, errors in Ollama's shape.

One server for the module: SmolLM2 with Qwen2.5's real template written into its GGUF (a template
that renders tools: the model shows the ``tools`` capability), installed in the store as ``tpl`` and
served by that name behind a key; SmolLM2's own file is installed too, as ``smol``, and not loaded.
"""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from ggufmutate import T_STRING, read_layout, write_layout
from templatesource import real_template
from test_serve_model import ServeProcess

pytestmark = pytest.mark.slow
ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

KEY = "k3y"
AUTH = {"Authorization": f"Bearer {KEY}"}
GREEDY = {"temperature": 0, "num_predict": 24}
HI = [{"role": "user", "content": "Say hello in one short sentence."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}  # fmt: skip
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0,
          "maximum": 150}}, "required": ["name", "age"], "additionalProperties": False}  # fmt: skip


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    home = tmp_path_factory.mktemp("ollama-home")
    layout = read_layout(smollm2_path)
    layout.set_scalar("tokenizer.chat_template", T_STRING, real_template("Qwen-Qwen2.5-7B-Instruct"))
    model = write_layout(layout, tmp_path_factory.mktemp("tpl") / "smollm2-qwen25-template.gguf")
    env = {"LOCALINFER_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    for path, name in ((model, "tpl"), (smollm2_path, "smol")):
        proc = run_cli("pull", str(path), "--name", name, env=env, timeout=180)
        assert proc.returncode == 0, proc.stderr
    with ServeProcess(Path("tpl"), "-np", "4", "-c", "2048", "--api-key", KEY, home=home) as s:
        s.model_path = model  # type: ignore[attr-defined]
        yield s


def client(s: ServeProcess) -> Any:
    return ollama.Client(host=s.base, headers=AUTH, timeout=300)


def call(s: ServeProcess, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    status, _, data = s.request(method, path, body, headers={**AUTH, **(headers or {})})
    return status, json.loads(data) if data else None


# -- what does not generate -------------------------------------------------------------------------------
def test_root_version_and_the_key(server):
    for method in ("GET", "HEAD"):
        status, _, data = server.request(method, "/")  # liveness: no key needed
        assert status == 200 and (method == "HEAD" or b"localinfer is running" in data)
    assert call(server, "GET", "/api/version")[1]["version"].count(".") == 2
    status, _, data = server.request("GET", "/api/tags")  # no key
    assert status == 401 and "API key" in json.loads(data)["error"]
    with pytest.raises(ollama.ResponseError) as err:
        ollama.Client(host=server.base, headers={"Authorization": "Bearer wrong"}).list()
    assert err.value.status_code == 401


def test_list_show_and_ps_with_the_ollama_client(server):
    c = client(server)
    models = {m.model: m for m in c.list().models}
    assert set(models) == {"tpl", "smol"}
    tpl = models["tpl"]
    assert tpl.size == server.model_path.stat().st_size
    assert len(tpl.digest) == 64 and tpl.modified_at is not None
    assert tpl.details.format == "gguf" and tpl.details.family == "llama"
    assert tpl.details.parameter_size == "135M" and tpl.details.quantization_level == "Q4_1"
    served = {m["name"]: m["localinfer"]["served"] for m in call(server, "GET", "/api/tags")[1]["models"]}
    assert served == {"tpl": True, "smol": False}

    shown = c.show("tpl")
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] == 8192 and shown.modelinfo["general.parameter_count"] > 100_000_000
    assert "<tool_call>" in shown.template
    assert set(shown.capabilities) == {"completion", "tools"}
    assert "tools" not in c.show("smol").capabilities  # read from its own file: chatml knows no tools
    with pytest.raises(ollama.ResponseError) as err:
        c.show("nope")
    assert err.value.status_code == 404

    running = c.ps().models
    assert [m.model for m in running] == ["tpl"]
    assert running[0].context_length == 2048 and running[0].size > tpl.size  # weights and KV cache
    assert running[0].expires_at is not None


def test_embed_and_the_older_embeddings(server):
    c = client(server)
    out = c.embed(model="tpl", input=["hello", "a longer sentence about the sea"])
    assert len(out.embeddings) == 2 and len(out.embeddings[0]) == 576
    assert abs(sum(x * x for x in out.embeddings[0]) - 1.0) < 1e-3  # normalized, as Ollama's
    assert out.prompt_eval_count > 2 and out.total_duration > 0
    one = c.embeddings(model="tpl", prompt="hello").embedding
    assert max(abs(a - b) for a, b in zip(one, out.embeddings[0], strict=True)) < 1e-4
    oa = openai.OpenAI(base_url=server.base + "/v1", api_key=KEY, max_retries=0)
    assert max(abs(a - b) for a, b in zip(oa.embeddings.create(model="tpl", input="hello").data[0].embedding, one, strict=True)) < 1e-4
    long = "word " * 3000  # past the embedding context: truncated by default, as Ollama does
    assert len(c.embed(model="tpl", input=long).embeddings) == 1
    status, body = call(server, "POST", "/api/embed", {"model": "tpl", "input": long, "truncate": False})
    assert status == 400 and "input[0]" in body["error"]


# -- chat and generate --------------------------------------------------------------------------------------
def test_chat_whole_and_streamed_with_the_ollama_client(server):
    c = client(server)
    whole = c.chat(model="tpl", messages=HI, options=GREEDY, stream=False)
    text = whole.message.content
    assert text and whole.message.role == "assistant" and whole.done and whole.done_reason in ("stop", "length")
    assert whole.prompt_eval_count > 5 and 0 < whole.eval_count <= 24
    assert whole.total_duration >= whole.prompt_eval_duration + whole.eval_duration > 0 and whole.load_duration == 0
    parts = list(c.chat(model="tpl", messages=HI, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == text  # greedy: the same answer
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    last = parts[-1]
    assert last.done_reason == whole.done_reason and last.eval_count == whole.eval_count
    assert last.prompt_eval_count == whole.prompt_eval_count and last.total_duration > 0


def test_greedy_chat_equals_chat_completions(server):
    oa = openai.OpenAI(base_url=server.base + "/v1", api_key=KEY, max_retries=0)
    messages = [{"role": "system", "content": "You are terse."}, *HI]
    ours = client(server).chat(model="tpl", messages=messages, options=GREEDY)
    theirs = oa.chat.completions.create(model="tpl", messages=messages, max_tokens=24, temperature=0)
    assert ours.message.content == theirs.choices[0].message.content
    assert ours.eval_count == theirs.usage.completion_tokens and ours.prompt_eval_count == theirs.usage.prompt_tokens
    assert ours.done_reason == theirs.choices[0].finish_reason


def test_generate_templated_raw_and_streamed(server):
    c = client(server)
    prompt = "Name a colour."
    generated = c.generate(model="tpl", prompt=prompt, options=GREEDY)
    chatted = c.chat(model="tpl", messages=[{"role": "user", "content": prompt}], options=GREEDY)
    assert generated.response == chatted.message.content and generated.done
    streamed = list(c.generate(model="tpl", prompt=prompt, options=GREEDY, stream=True))
    assert "".join(p.response for p in streamed) == generated.response and streamed[-1].done
    raw = c.generate(model="tpl", prompt="The capital of France is", raw=True, options={"temperature": 0, "num_predict": 6})
    oa = openai.OpenAI(base_url=server.base + "/v1", api_key=KEY, max_retries=0)
    plain = oa.completions.create(model="tpl", prompt="The capital of France is", max_tokens=6, temperature=0)
    assert raw.response == plain.choices[0].text
    loading = c.generate(model="tpl")  # no prompt: Ollama's "load the model"
    assert loading.done and loading.done_reason == "load" and loading.response == ""


def test_format_json_schema_and_json(server):
    c = client(server)
    ask = [{"role": "user", "content": "Describe a person as JSON with a name and an age."}]
    for stream in (False, True):
        out = c.chat(model="tpl", messages=ask, format=PERSON, options={"temperature": 0, "num_predict": 64}, stream=stream)
        text = out.message.content if not stream else "".join(p.message.content for p in out)
        jsonschema.validate(json.loads(text), PERSON)
    out = c.generate(model="tpl", prompt="A JSON object describing a cat:", format="json", options={"temperature": 0, "num_predict": 64})
    assert out.response.startswith("{")  # any object; this small model may nest until the limit cuts it
    assert out.done_reason == "length" or isinstance(json.loads(out.response), dict)


def test_tools_a_call_and_its_result(server):
    # Ollama has no tool_choice (the model decides; this small one rarely calls): ours forces the call
    ask = [{"role": "user", "content": "What is the weather like in Paris, in celsius?"}]
    body = {"model": "tpl", "messages": ask, "tools": [WEATHER], "tool_choice": "required", "options": {"temperature": 0, "num_predict": 96}}
    status, whole = call(server, "POST", "/api/chat", {**body, "stream": False})
    assert status == 200, whole
    out = ollama.ChatResponse.model_validate(whole)  # the client's own types take it
    assert out.done_reason == "stop" and out.message.tool_calls, whole
    call0 = out.message.tool_calls[0]
    assert call0.function.name == "get_weather" and isinstance(call0.function.arguments, dict)
    jsonschema.validate(dict(call0.function.arguments), WEATHER["function"]["parameters"])
    status, _, data = server.request("POST", "/api/chat", body, headers=AUTH)
    streamed = [ollama.ChatResponse.model_validate(json.loads(line)) for line in data.splitlines()]
    calls = [tc for p in streamed for tc in (p.message.tool_calls or [])]
    assert [(t.function.name, dict(t.function.arguments)) for t in calls] == [(call0.function.name, dict(call0.function.arguments))]
    assert streamed[-1].done and not streamed[-1].message.tool_calls
    # the call and its result sent back through the client: arguments as an object, the result by tool_name
    turns = [*ask, out.message, {"role": "tool", "tool_name": "get_weather", "content": '{"temperature": 21}'}]
    answer = client(server).chat(model="tpl", messages=turns, tools=[WEATHER], options={"temperature": 0, "num_predict": 32})
    assert answer.done and (answer.message.content or answer.message.tool_calls)
    status, body = call(server, "POST", "/api/chat", {"model": "tpl", "messages": [*ask, {"role": "tool", "content": "21"}]})
    assert status == 400 and "messages[1]" in body["error"]  # a result that answers no call


def test_langchain_chat_ollama_invoke_and_stream(server):
    lc = pytest.importorskip("langchain_ollama")
    chat = lc.ChatOllama(model="tpl", base_url=server.base, temperature=0, num_predict=24, client_kwargs={"headers": AUTH})
    msg = chat.invoke("Say hello in one short sentence.")
    assert msg.content and msg.usage_metadata["output_tokens"] > 0 and msg.usage_metadata["input_tokens"] > 5
    streamed = "".join(chunk.content for chunk in chat.stream("Say hello in one short sentence."))
    assert streamed == msg.content


# -- errors, limits, cancellation ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/chat", {"model": "tpl", "messages": HI, "options": {"temperature": 7}}, "options.temperature"),
        ("/api/chat", {"model": "tpl", "messages": HI, "format": "yaml"}, "format"),
        ("/api/chat", {"model": "tpl", "messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, "messages[0].images"),
        ("/api/chat", {"model": "tpl", "messages": HI, "think": True}, "think"),
        ("/api/chat", {"model": "tpl", "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ("/api/chat", {"messages": HI}, "model"),
        ("/api/generate", {"model": "tpl", "prompt": "x", "suffix": "y"}, "suffix"),
        ("/api/generate", {"model": "tpl", "prompt": "x", "options": {"num_predict": 0}}, "options.num_predict"),
        ("/api/embed", {"model": "tpl", "input": 3}, "input"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(server, path, body, field):
    status, answer = call(server, "POST", path, body)
    assert status == 400 and set(answer) == {"error"} and field in answer["error"], answer


def test_other_models_pulls_and_unknown_routes_and_the_server_keeps_serving(server):
    status, body = call(server, "POST", "/api/chat", {"model": "smol", "messages": HI})
    assert status == 404 and "not loaded" in body["error"]
    for path in ("/api/pull", "/api/push", "/api/create", "/api/copy"):
        status, body = call(server, "POST", path, {"model": "x"})
        assert status == 501 and "not supported" in body["error"], path
    assert "localinfer pull" in call(server, "POST", "/api/pull", {"model": "x"})[1]["error"]
    assert call(server, "DELETE", "/api/delete", {"model": "smol"})[0] == 501
    assert call(server, "GET", "/api/nope")[0] == 404
    assert client(server).chat(model="tpl", messages=HI, options={"num_predict": 2}).done


def test_a_client_that_goes_away_cancels_and_metrics_count(server):
    before = server.metrics(AUTH)
    assert server.request("GET", "/api/tags")[0] == 401  # counted too
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = json.dumps({"model": "tpl", "messages": HI, "options": {"num_predict": 1500, "temperature": 1}})
    conn.request("POST", "/api/chat", body=body, headers={"Content-Type": "application/json", **AUTH})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("content-type").startswith("application/x-ndjson")
    first = json.loads(resp.readline())
    assert first["done"] is False and first["message"]["role"] == "assistant"
    conn.close()  # gone mid-answer
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = server.metrics(AUTH)
        if m.get('localinfer_requests_total{endpoint="ollama_chat",status="499"}', 0) > before.get(
                'localinfer_requests_total{endpoint="ollama_chat",status="499"}', 0) and m["localinfer_requests_running"] == 0:  # fmt: skip
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the request was not cancelled: {m}")
    assert m['localinfer_requests_finished_total{reason="interrupted"}'] > before.get('localinfer_requests_finished_total{reason="interrupted"}', 0)
    assert m.get('localinfer_requests_total{endpoint="ollama_tags",status="401"}', 0) >= 1


def test_show_s_modelfile_names_the_blob_not_the_user_s_paths():
    from localinfer.serve.wires.ollama import models as om
    blob = Path("/home/someone/.localinfer/blobs/sha256-" + "ab" * 32)
    installed = om.ListedModel("smol", 1, "ab" * 32, "", path=blob)
    assert om.show(installed, None, None)["modelfile"] == f"# served by localinfer\nFROM sha256-{'ab' * 32}\n"
    local = om.ListedModel("mine", 1, "", "", path=Path("/home/someone/models/mine.gguf"))  # never hashed
    assert "/home" not in json.dumps(om.show(local, None, None)) and "FROM mine\n" in om.show(local, None, None)["modelfile"]
