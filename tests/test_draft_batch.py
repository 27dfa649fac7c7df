"""Speculative decoding in the batched engine (engine/batch_draft.py) on the real SmolLM2: several
sequences in one batch, each carrying its own draft, give the plain decode's tokens; a constraint,
stop strings and logprobs behave as without drafting; the KV cells of rejected tokens leave the
cache; and `serve --draft ngram` reports what it drafted in its timings and /metrics.

The engine tests force drafting (every match drafted, no back-off), as tests/test_draft_model.py
does and for the same reason: they test what verification does with a draft, not whether one pays
on this machine. One thread: a batch row then rounds as a one-token step does (identical log
probabilities measured, benchmarks/results/draft-2026-12-04.txt); the tie tolerance is kept anyway.
"""

from __future__ import annotations

import json

import pytest

from localinfer.engine import draft as d
from localinfer.engine import draft_costs as dc
from localinfer.engine.backend import llama_cpp
from localinfer.request.sampling import SamplingOptions

pytestmark = pytest.mark.slow

TIE = 0.15  # as tests/test_draft_model.py: a near-tie the kernels may round apart
GREEDY = SamplingOptions(temperature=0)
PASSAGE = (
    "The lighthouse keeper, Mara Quint, logged every ship that passed the northern reef. In 1887 she "
    "recorded forty-one vessels, three of which ran aground in the October storms. The harbour board "
    "awarded her a silver medal and a pension of twelve pounds a year."
)
TEXTS = {
    "copy": f"Repeat this passage exactly, word for word:\n\n{PASSAGE}",
    "quote": f"{PASSAGE}\n\nQuote the sentence about the medal, word for word.",
    "free": "Write a short story about a robot who learns to paint.",
}


@pytest.fixture(scope="module")
def batch_model(smollm2_path):
    from localinfer.generate import loading
    from localinfer.batch import job as batchjob
    from localinfer.engine.templates import ChatTemplate
    from localinfer.engine.types import LoadOptions
    from localinfer.store import resolve_model

    options = batchjob.batch_load_options(LoadOptions(n_threads=1), parallel=3, ctx_per_seq=512)
    loaded = loading.load(resolve_model(str(smollm2_path)), options)
    m = loaded.model
    template = ChatTemplate(source="gguf", template=m.chat_template, bos_text=m.bos_text, eos_text=m.eos_text)

    def prompt(text: str) -> list[int]:
        p = template.render([{"role": "user", "content": text}])
        return m.tokenize(p.text, add_special=p.add_special, parse_special=True)

    yield m, prompt
    loaded.close()


@pytest.fixture(autouse=True)
def always_draft(monkeypatch):
    monkeypatch.setattr(d.NgramDrafter, "worth", lambda self, n, available: available)
    monkeypatch.setattr(d.DraftCosts, "choose", _whole)  # a batch's
    monkeypatch.setattr(d, "MISSES_TO_PAUSE", 10**9)


def _whole(self, n_seqs, offers, at=None, caps=None, room=None):
    """Every offer whole: every id padded to the longest where all can take it (one pass, throwaway
    rows after the shorter drafts), else each offer as far as the batch has room (several passes)."""
    width = max(k for _, k in offers)
    if caps is not None and min(caps) >= width and len(caps) * width <= room:
        return dc.Layout([k for _, k in offers], width, 0, len(caps) - 1)
    counts, left = [], room if room is not None else 1 << 30
    for _, k in offers:
        counts.append(min(k, left))
        left -= counts[-1]
    return dc.Layout(counts, 0, 0, -1)


def _run(model, jobs, check_cells=False):
    """Run ``jobs`` three at a time (keeping caches, as serve does); results by key. With
    ``check_cells``: at every result, each sequence's cells are exactly what the decoder counts."""
    from localinfer.engine.batch import BatchDecoder

    out = {}
    with BatchDecoder(model, 3, keep_cache=True) as decoder:
        for r in decoder.run(jobs):
            out[r.key] = r
            if check_cells:
                _assert_cells(model, decoder)
    return out, decoder.stats


def _assert_cells(model, decoder):
    mem = llama_cpp.llama_get_memory(model._ctx)
    held = {s.seq: s.pos for s in decoder._active}
    for sid in range(decoder.n_parallel):
        n = held.get(sid, len(decoder._slots.kept[sid]))
        assert int(llama_cpp.llama_memory_seq_pos_max(mem, sid)) + 1 == n, f"sequence {sid}"


def _same_greedy(a, b):
    """Token for token (by the logprobs entries) up to a difference only at a near-tie of the plain run."""
    la, lb = a.stats.logprobs, b.stats.logprobs
    for i, (x, y) in enumerate(zip(la, lb)):
        if x["token"] != y["token"]:
            alts = {e["token"]: e["logprob"] for e in x["top_logprobs"]}
            assert y["token"] in alts and x["logprob"] - alts[y["token"]] < TIE, f"token {i}: no tie"
            return False
        assert y["logprob"] == pytest.approx(x["logprob"], abs=TIE), f"token {i}"
    assert a.text == b.text and a.stats.finish_reason == b.stats.finish_reason
    return True


def test_batched_greedy_answers_are_the_plain_decodes(batch_model):
    from localinfer.engine.batch import SeqJob

    model, prompt = batch_model
    prompts = {k: prompt(t) for k, t in TEXTS.items()}
    runs = {}
    for draft in (False, True):
        jobs = [SeqJob(k, p, GREEDY, max_tokens=70, logprobs=5, draft=draft) for k, p in prompts.items()]
        runs[draft] = _run(model, jobs, check_cells=draft)
    (plain, plain_stats), (drafted, stats) = runs[False], runs[True]
    assert plain_stats.draft_tokens == 0 and all(r.stats.draft is None for r in plain.values())
    for key in TEXTS:
        _same_greedy(plain[key], drafted[key])
        st = drafted[key].stats
        assert st.draft == "ngram" and 0 <= st.draft_accepted <= st.draft_tokens and st.draft_steps > 0
        assert len(st.logprobs) == st.completion_tokens
    copy = drafted["copy"].stats
    assert "lighthouse keeper" in drafted["copy"].text and copy.draft_accepted >= copy.draft_tokens // 2
    assert stats.draft_tokens == sum(r.stats.draft_tokens for r in drafted.values())
    assert stats.filler_tokens > plain_stats.filler_tokens  # shorter drafts padded to the step's width
    assert stats.draft_accepted == sum(r.stats.draft_accepted for r in drafted.values())


def test_a_constraint_and_a_stop_string_with_drafts_in_one_batch(batch_model):
    from localinfer.engine.batch import SeqJob
    from localinfer.request.structured import from_schema

    model, prompt = batch_model
    schema = {"type": "object", "properties": {"keeper": {"type": "string"}, "vessels": {"type": "integer"}},
              "required": ["keeper", "vessels"], "additionalProperties": False}  # fmt: skip
    doc = '{"keeper": "Mara Quint", "vessels": 41}'
    json_prompt = prompt(f"Copy this JSON exactly:\n{doc}\n{doc}")
    copy_prompt = prompt(TEXTS["copy"])
    runs = {}
    for draft in (False, True):
        jobs = [
            SeqJob("json", json_prompt, GREEDY, max_tokens=40, constraint=from_schema(json.dumps(schema)), draft=draft),
            SeqJob("stop", copy_prompt, GREEDY, max_tokens=120, stop=("October",), logprobs=3, draft=draft),
        ]
        runs[draft] = _run(model, jobs, check_cells=draft)[0]
    plain, drafted = runs[False], runs[True]
    value = json.loads(drafted["json"].text)
    assert set(value) == {"keeper", "vessels"} and isinstance(value["vessels"], int)
    assert drafted["json"].stats.document == "complete" and drafted["json"].stats.draft_tokens > 0
    assert drafted["json"].text == plain["json"].text
    stop = drafted["stop"]
    assert stop.stats.finish_reason == "stop" and stop.stats.stop_string == "October"
    assert "October" not in stop.text and "forty-one vessels" in stop.text and stop.stats.draft_accepted > 0
    if _same_greedy(plain["stop"], stop):
        assert len(stop.stats.logprobs) == len(plain["stop"].stats.logprobs)  # cut at the stop string alike


def test_serve_with_draft_reports_its_drafts(smollm2_path, tmp_path):
    pytest.importorskip("openai")
    from test_serve_model import ServeProcess

    body = {"messages": [{"role": "user", "content": TEXTS["copy"]}], "max_tokens": 60, "temperature": 0}
    with ServeProcess(smollm2_path, "--draft", "ngram", "-np", "2", "-c", "512", "-t", "1", home=tmp_path) as s:
        status, answer = s.json("POST", "/v1/chat/completions", body)
        assert status == 200, answer
        t = answer["timings"]
        assert "lighthouse keeper" in answer["choices"][0]["message"]["content"]
        assert t["draft_n"] > 0 and 0 <= t["draft_n_accepted"] <= t["draft_n"]
        m = s.metrics()
        assert m["localinfer_spec_decode_num_draft_tokens_total"] == t["draft_n"]
        assert m["localinfer_spec_decode_num_accepted_tokens_total"] == t["draft_n_accepted"]
        assert m["localinfer_spec_decode_num_drafts_total"] >= 1
        # per request, llama-server's fields: n_max 0 drafts nothing, n_max 2 at most 2 tokens a step
        status, off = s.json("POST", "/v1/chat/completions", {**body, "speculative.n_max": 0})
        assert status == 200 and "draft_n" not in off["timings"]
        assert off["choices"][0]["message"]["content"] == answer["choices"][0]["message"]["content"]
        spec = [k for k in m if "spec_decode" in k]
        assert [s.metrics()[k] for k in spec] == [m[k] for k in spec]  # nothing drafted
        status, short = s.json("POST", "/v1/chat/completions", {**body, "speculative.n_max": 2, "speculative.n_min": 2})
        assert status == 200 and short["timings"]["draft_n"] > 0, short
        after = s.metrics()
        drafts = after["localinfer_spec_decode_num_drafts_total"] - m["localinfer_spec_decode_num_drafts_total"]
        assert short["timings"]["draft_n"] == 2 * drafts  # every draft exactly n_min = n_max tokens
        status, bad = s.json("POST", "/v1/chat/completions", {**body, "speculative.n_max": -1})
        assert status == 400 and "speculative.n_max" in json.dumps(bad)
