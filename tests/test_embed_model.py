"""Embeddings for real, with SmolLM2 and Gemma 3 (decoder models, mean pooling): /v1/embeddings gives
llama-server's vectors (``--embeddings --pooling mean``, same model: cosine >= 0.999 for every input),
`localinfer embed` gives serve's, the official ``openai`` client reads both encodings, bad input is a
400 and the server goes on serving chat and embeddings, also at the same time."""

from __future__ import annotations

import base64
import json
import math
import os
import sqlite3
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import run_cli
from test_serve_model import ServeProcess

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [
    "The cat sat on the mat.",
    "Quantum computers use qubits, which can be in superpositions of 0 and 1.",
    "Paris is the capital of France; Berlin is the capital of Germany.",
    "naïve café — déjà vu, 東京, emoji 🙂",
    "def add(a, b):\n    return a + b",
    " ".join(f"word{i}" for i in range(120)),  # a longer input, several hundred tokens
    "x",
]


def cosine(a: list[float], b: list[float]) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(math.fsum(x * x for x in a) * math.fsum(y * y for y in b))


def _llama_server() -> Path:
    env = os.environ.get("LLAMA_NATIVE_BIN")
    path = Path(env) / "llama-server" if env else ROOT / "benchmarks" / ".build" / "bin" / "llama-server"
    if not os.access(path, os.X_OK):
        pytest.skip(f"{path} is not built: bash benchmarks/build_native.sh builds it (.ci/run does)")
    return path


def _post(port: int, body: dict, path: str = "/v1/embeddings") -> tuple[int, dict]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)  # a loaded CI machine is slow
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def _vectors(port: int, inputs: list) -> list[list[float]]:
    status, body = _post(port, {"input": inputs})
    assert status == 200, body
    return [d["embedding"] for d in sorted(body["data"], key=lambda d: d["index"])]


@pytest.fixture(scope="module", params=["smollm2", "gemma"])
def model(request, smollm2_path, tmp_path_factory):
    if request.param == "smollm2":
        return smollm2_path
    from models import gemma_path

    return gemma_path(tmp_path_factory)


@pytest.fixture(scope="module")
def reference(model, tmp_path_factory):
    """llama-server with --embeddings --pooling mean: the vectors of TEXTS sent in one request (its
    slots decode them in one batch, as ours does) and one input per request.

    Both ways are compared because llama.cpp's CPU flash attention takes another kernel for a ubatch
    of fewer than its Q tile of tokens (f16 accumulation) than for a larger one (tiled, f32): for
    Gemma's 2-token input "x" the two differ by a cosine of 0.9988, whoever decodes it."""
    from test_remote_server import _free_port, _repack_flag, _stop, _wait_healthy

    port = _free_port()
    log = open(tmp_path_factory.mktemp("llama-server-embed") / "log.txt", "w")
    proc = subprocess.Popen(
        [str(_llama_server()), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "--embeddings", "--pooling", "mean",
         "-c", "4096", "-b", "512", "-ub", "512", "-np", "8", "--kv-unified", "-t", "2", *_repack_flag()],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc)
        yield _vectors(port, TEXTS), [_vectors(port, [t])[0] for t in TEXTS]
    finally:
        _stop(proc)
        log.close()


@pytest.fixture(scope="module")
def ours(model, tmp_path_factory):
    with ServeProcess(model, "-np", "2", "-c", "256", "-t", "2", "--no-log", home=tmp_path_factory.mktemp("embed-serve")) as s:
        yield s


def test_serve_gives_llama_servers_vectors(ours, reference):
    together, alone = reference
    mine = _vectors(ours.port, TEXTS)  # all in one request: several sequences per llama_decode
    mine_alone = [_vectors(ours.port, [t])[0] for t in TEXTS]
    assert len(mine) == len(together) == len(TEXTS)
    for text, a, b, c, d in zip(TEXTS, mine, together, mine_alone, alone, strict=True):
        assert len(a) == len(b)
        assert cosine(a, b) >= 0.999, text
        assert cosine(c, d) >= 0.999, text
        assert math.isclose(math.fsum(x * x for x in a), 1.0, rel_tol=1e-5)  # L2-normalized, as OpenAI's


def test_localinfer_embed_gives_serves_vectors(ours, model, tmp_path):
    lines = "".join(json.dumps({"id": f"t{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS))
    res = run_cli("embed", "-m", str(model), "--offline", "-t", "2", "-q", input=lines)
    assert res.returncode == 0, res.stderr.decode()
    records = [json.loads(line) for line in res.stdout.decode().splitlines()]
    assert [r["id"] for r in records] == [f"t{i}" for i in range(len(TEXTS))]
    served = _vectors(ours.port, TEXTS)
    for r, v in zip(records, served, strict=True):
        assert cosine(r["embedding"], v) >= 0.99999
        assert r["tokens"] > 0
    status, body = _post(ours.port, {"input": TEXTS})
    assert body["usage"]["prompt_tokens"] == sum(r["tokens"] for r in records)


def test_the_openai_client_reads_floats_and_base64(ours, model):
    if model.name.startswith("gemma"):
        pytest.skip("one model is enough for the client")
    client = openai.OpenAI(base_url=ours.base + "/v1", api_key="none")
    floats = client.embeddings.create(model="any", input=TEXTS[:3], encoding_format="float")
    assert [d.index for d in floats.data] == [0, 1, 2] and floats.usage.prompt_tokens > 3
    default = client.embeddings.create(model="any", input=TEXTS[:3])  # the client asks for base64 and decodes it
    as_b64 = client.embeddings.create(model="any", input=TEXTS[0], encoding_format="base64")
    raw = base64.b64decode(as_b64.data[0].embedding)
    decoded = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    for f, d in zip(floats.data, default.data, strict=True):
        assert f.embedding == pytest.approx(d.embedding, abs=1e-6)
    assert decoded == pytest.approx(floats.data[0].embedding, abs=1e-6)
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model="any", input="x", dimensions=8)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"input": []}, "must not be an empty list"),
        ({"input": ["a"] * 10_000}, "a request may have 2048"),
        ({"input": " ".join(["word"] * 800)}, "the embedding context holds 512"),
        ({"input": ["ok", 7]}, "must be a non-empty string"),
        ({"input": [[10**9]]}, "out of the vocabulary"),
    ],
)
def test_bad_input_is_a_400_and_the_server_keeps_serving(ours, body, words):
    status, answer = _post(ours.port, body)
    assert status == 400 and words in answer["error"]["message"], answer
    assert len(_vectors(ours.port, ["still here"])) == 1
    status, chat = _post(ours.port, {"prompt": "Hello", "max_tokens": 3, "temperature": 0}, "/v1/completions")
    assert status == 200 and chat["usage"]["completion_tokens"] >= 1


def test_chat_and_embeddings_at_once_give_what_each_gives_alone(ours):
    body = {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    status, alone = _post(ours.port, body, "/v1/completions")
    assert status == 200
    expected = _vectors(ours.port, TEXTS)
    got: dict[str, object] = {}

    def embed_many() -> None:
        got["vectors"] = [_vectors(ours.port, TEXTS) for _ in range(2)]

    t = threading.Thread(target=embed_many)
    t.start()
    status, together = _post(ours.port, body, "/v1/completions")
    t.join(900)
    assert status == 200 and together["choices"][0]["text"] == alone["choices"][0]["text"]
    for vectors in got["vectors"]:  # type: ignore[union-attr]
        assert all(cosine(a, b) >= 0.99999 for a, b in zip(vectors, expected, strict=True))


def test_embed_cli_records_errors_truncates_and_counts_tokens_in_the_history(smollm2_path, tmp_path, isolated_home):
    src = tmp_path / "in.txt"
    long_text = " ".join(["word"] * 100)  # 100 tokens: SmolLM2 adds no BOS
    src.write_text(f"short one\n{long_text}\nlast\n")
    out = tmp_path / "out.jsonl"
    res = run_cli("embed", str(src), "-m", str(smollm2_path), "-c", "32", "-o", str(out), "--offline", "-t", "2")
    assert res.returncode == 0, res.stderr.decode()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == [1, 2, 3]
    assert "error" not in records[0] and "error" not in records[2]
    assert records[1]["line"] == 2 and records[1]["error"].startswith("the input is 100 tokens; the embedding context holds 32")
    assert "2/3 inputs embedded · 1 error" in res.stderr.decode()
    row = sqlite3.connect(isolated_home / "history.db").execute(
        "SELECT command, prompt_tokens, completion_tokens, extra FROM requests").fetchall()  # fmt: skip
    assert len(row) == 1 and row[0][0] == "embed" and row[0][2] == 0
    assert row[0][1] == records[0]["tokens"] + records[2]["tokens"]
    assert json.loads(row[0][3])["inputs"] == 3
    res = run_cli("embed", str(src), "-m", str(smollm2_path), "-c", "32", "--truncate", "--offline", "-t", "2", "-q", "--no-log")
    cut = [json.loads(line) for line in res.stdout.decode().splitlines()]
    assert cut[1]["tokens"] == 32 and cut[1]["truncated_tokens"] == 68


def test_the_api_batches_as_it_embeds_one_by_one_and_pooling_and_normalize_change_the_vectors(smollm2_path):
    import localinfer

    with localinfer.load(str(smollm2_path), n_threads=2) as m:
        together = m.embed(TEXTS)
        alone = [m.embed([t])[0] for t in TEXTS]
        # not bit-identical: llama.cpp's flash attention takes another kernel for a short ubatch (docs/embeddings.md)
        assert all(cosine(a, b) >= 0.999 for a, b in zip(together, alone, strict=True))
        assert len(together[0]) == 576
        raw, unit = m.embed(TEXTS[:1], normalize=False)[0], m.embed(TEXTS[:1])[0]
        assert abs(math.fsum(x * x for x in raw) - 1.0) > 0.01 and cosine(raw, unit) >= 0.99999
        last = m.embed(TEXTS[:2], pooling="last")
        assert cosine(last[0], together[0]) < 0.99
        text = m.generate("Say hi", max_tokens=4, temperature=0).text  # generation still works beside it
        assert text


def test_embed_endpoint_asks_a_server(ours, model):
    res = run_cli("embed", "--endpoint", ours.base + "/v1", "-q", "--no-log", input="\n".join(TEXTS[:3]) + "\n")
    assert res.returncode == 0, res.stderr.decode()
    records = [json.loads(line) for line in res.stdout.decode().splitlines()]
    served = _vectors(ours.port, TEXTS[:3])
    assert [r["id"] for r in records] == [1, 2, 3]
    assert all(cosine(r["embedding"], v) >= 0.99999 for r, v in zip(records, served, strict=True))
    res = run_cli("embed", "--endpoint", ours.base + "/v1", "-q", "--no-log", input=" ".join(["word"] * 800) + "\nfine\n")
    records = [json.loads(line) for line in res.stdout.decode().splitlines()]
    assert "512" in records[0]["error"] and records[1]["embedding"]


def test_no_input_and_bad_flags_are_one_line(smollm2_path):
    res = subprocess.run([sys.executable, "-m", "localinfer", "embed", "/no/such/file", "-m", str(smollm2_path)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 2 and res.stderr.strip() == "Error: input file not found: /no/such/file"
