"""Greedy is a promise (issue 52): with temperature 0, ``--draft`` never changes the answer.

A verify batch's rows round apart from one-token steps (benchmarks/draft_margin.py), so greedy
verification keeps a row's top token only where it leads the runner-up by more than
speculate.GREEDY_MARGIN, and decodes that position alone otherwise (engine/speculate.py). Here: the
rule on crafted logits, what verification hands out when it is unsure (single path and batch),
and the copy task at 2 threads on both real models, token for token with and without drafting,
where the answers parted before the rule (at a near-tie the batch rounded the other way).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from localinfer.engine import draft as d
from localinfer.engine.types import GenerationStats, LoadOptions
from localinfer.request.sampling import SamplingOptions

GREEDY = SamplingOptions(temperature=0)
@pytest.fixture
def rows(monkeypatch):
    """GreedyPick on crafted logits: ``rows[i]`` is batch row i; the chain is greedy alone unless a
    test sets ``chain_n``; accepted tokens are listed."""
    from localinfer.engine import speculate

    state = SimpleNamespace(rows=[], accepted=[], chain_n=1, keep=[])
    fake = SimpleNamespace(
        llama_get_logits_ith=lambda ctx, i: state.rows[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
        llama_sampler_chain_n=lambda chain: state.chain_n,
        llama_sampler_accept=lambda chain, token: state.accepted.append(token),
        llama_token_data=speculate.llama_cpp.llama_token_data,
        llama_token_data_array=speculate.llama_cpp.llama_token_data_array,
    )
    monkeypatch.setattr(speculate, "llama_cpp", fake)
    state.fake = fake
    return state


def _row(*top: float, n: int = 50) -> np.ndarray:
    r = np.full(n, -5.0, dtype=np.float32)
    r[: len(top)] = top
    return r


@pytest.mark.llama  # engine.speculate loads libllama's bindings (the calls themselves are faked here)
def test_a_row_is_picked_only_where_its_top_token_leads_by_the_margin(rows):
    from localinfer.engine.speculate import GREEDY_MARGIN, GreedyPick

    rows.rows = [_row(3.0, 3.0 + GREEDY_MARGIN + 0.05), _row(7.0, 7.0 - GREEDY_MARGIN / 2), _row(1.0, 1.0)]
    pick = GreedyPick(None, 50)
    assert pick.pick("chain", 0) == 1 and rows.accepted == [1]  # a clear lead: picked and accepted
    assert pick.pick("chain", 1) is None  # a near-tie: unsure, nothing accepted
    assert pick.pick("chain", 2) is None  # an exact tie
    assert rows.accepted == [1] and pick.alone == 2
    assert rows.rows[1][0] == 7.0  # the row is read in place and left as it was


@pytest.mark.llama
def test_with_a_constraint_the_margin_is_over_the_tokens_it_allows(rows):
    """A chain with more than greedy is applied by hand: the lead is over what it left possible."""
    from localinfer.engine.speculate import GREEDY_MARGIN, GreedyPick

    def apply(chain, ref):  # a constraint forbidding token 0, then greedy
        arr = ref._obj
        cands = np.ctypeslib.as_array(ctypes.cast(arr.data, ctypes.POINTER(ctypes.c_float)), shape=(arr.size * 3,))
        logits = cands[1::3]
        logits[0] = -np.inf
        arr.selected = int(np.argmax(logits))

    rows.fake.llama_sampler_apply = apply
    rows.chain_n = 3
    rows.rows = [_row(9.0, 2.0, 2.0 - 2 * GREEDY_MARGIN), _row(9.0, 2.0, 2.0 - GREEDY_MARGIN / 3)]
    pick = GreedyPick(None, 50)
    assert pick.pick("chain", 0) == 1 and rows.accepted == [1]
    assert pick.pick("chain", 1) is None and rows.accepted == [1]  # 0 forbidden: 1 and 2 are near-tied


@pytest.mark.llama
@pytest.mark.parametrize(
    "picks, group, kept, sure",
    [
        ([5, 6, 7, 8], [(5, 0), (6, 1), (7, 2), (8, 3)], 3, True),  # kept whole, then the model's own
        ([5, 9], [(5, 0), (9, 1)], 1, True),  # the model disagrees at row 1
        ([5, None], [(5, 0)], 1, False),  # unsure of row 1: 5 is handed out, then decoded again alone
        ([None], [], 0, False),  # unsure of row 0: nothing kept, the token before the draft again
        ([5, 6, 7, None], [(5, 0), (6, 1), (7, 2)], 3, False),  # all kept, unsure of the last row
    ],
)
def test_verification_stops_at_the_first_unsure_row(picks, group, kept, sure):
    from localinfer.engine.speculate import verify_draft

    assert verify_draft(lambda i: picks[i], [5, 6, 7]) == (group, kept, sure)


@pytest.mark.llama
def test_a_batch_sequence_unsure_of_a_row_decodes_it_alone_next_step():
    """batch_draft.verify: unsure of row 0, ``last`` itself is evaluated again (its cell is the one
    before the draft); plan then gives that sequence one row, no draft and no padding."""
    from localinfer.engine import batch_draft

    drafter = d.NgramDrafter([1, 2, 3, 1, 2, 3, 1, 2], max_draft=4)
    drafter.greedy = SimpleNamespace(pick=lambda chain, i: None)
    s = SimpleNamespace(chain=None, draft=[3, 1], idx=4, drafter=drafter, pos=12, job=SimpleNamespace(sampling=GREEDY),
                        prompt=None, shift=0, seq=0, pad=0, max_tokens=None, n_gen=5, limiter=None)  # fmt: skip
    group, kept = batch_draft.verify(s, sample=None)
    assert group == [] and kept == 0 and s.pos == 9 and drafter.alone  # last was at 12 - 2 - 1
    s.draft = [7]
    rows, layout = batch_draft.plan([s], room=8, n_ctx_seq=512, filler_pos=None)
    assert s.draft == [] and s.pad == 0 and rows == 0 and not drafter.alone  # one step alone, then drafts again
    sampled = SimpleNamespace(pick=lambda chain, i: 3 if i == 4 else None)
    drafter.greedy, s.draft, s.pos = sampled, [3, 1], 12
    assert batch_draft.verify(s, sample=None) == ([(3, 4)], 1) and s.pos == 12  # _verified places it


def test_after_a_replay_drafting_rests_whatever_the_free_tries_say():
    drafter = d.NgramDrafter([1, 2, 3, 4, 1, 2], max_draft=4)
    drafter.hold()
    for token in ([3, 4, 1, 2] * 4)[: d.FIRST_PAUSE]:  # copying, but resting
        assert drafter.offer(4) == (0, [])
        drafter.extend([token])
    assert drafter.offer(4)[1]  # the answer still copies: drafts again
    drafter.hold()
    assert drafter._hold == 2 * d.FIRST_PAUSE  # longer at each replay


# -- the copy task at 2 threads, real models -------------------------------------------------------


@pytest.fixture
def always_draft(monkeypatch):
    """Every match drafted, no back-off (as tests/test_draft_model.py): what verification does with
    a draft, not whether one pays on this machine."""
    monkeypatch.setattr(d.NgramDrafter, "worth", lambda self, n, available: available)
    monkeypatch.setattr(d, "MISSES_TO_PAUSE", 10**9)
    monkeypatch.setattr(d.NgramDrafter, "hold", lambda self: None)  # no rest after a replay either


def _copy_prompt(model, raw: bool) -> list[int]:
    """benchmarks/draft_vs_plain.py's copy tasks where each model's drafted answer parted before:
    Gemma's base model copying three passages (a plain completion), SmolLM2 writing a module again
    (a ~500-token prompt: past 512 cells a one-token step's attention at 2 threads adds up in
    another order than a batch's; engine.stopping as it was). Both texts are in tests/data."""
    data = Path(__file__).parent / "data"
    if raw:
        passages = (data / "copy_passages.txt").read_text()
        return model.tokenize(f"Here is a text:\n\n{passages}\n\nThe same text, copied exactly:\n\n", add_special=True)
    from localinfer.engine.templates import ChatTemplate

    module = (data / "copy_module.txt").read_text()
    t = ChatTemplate(source="gguf", template=model.chat_template, bos_text=model.bos_text, eos_text=model.eos_text)
    p = t.render([{"role": "user", "content": f"Write this module again, unchanged:\n\n```python\n{module}```"}])
    return model.tokenize(p.text, add_special=p.add_special, parse_special=True)


def _answer(model, prompt, n):
    model.reset()
    stats = GenerationStats()
    tokens = [s.token for s in model.generate(prompt, GREEDY, stats, max_tokens=n) if s.token is not None]
    return tokens, stats


@pytest.mark.llama  # the model's fixture is asked for by name
@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_the_copy_task_at_two_threads_is_the_plain_greedy_answer(request, always_draft, which):
    """Before the margin rule both answers parted from the plain ones (SmolLM2 at token 30, where
    the plain run's top two were 0.081 nats apart; Gemma at token 32, 0.19 apart); now token for
    token, and the rule decided some positions alone."""
    from localinfer.engine.model import LlamaModel

    path = request.getfixturevalue(f"{which}_path")
    raw = which == "gemma"
    plain = LlamaModel(path, LoadOptions(n_ctx=2048, n_threads=2))
    drafted = LlamaModel(path, LoadOptions(n_ctx=2048, n_threads=2, draft="ngram", draft_max=8))
    try:
        prompt = _copy_prompt(plain, raw)
        a, _ = _answer(plain, prompt, 120)
        b, stats = _answer(drafted, prompt, 120)
    finally:
        plain.close()
        drafted.close()
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    assert first is None and len(a) == len(b), f"parted at token {first} of {len(a)}"
    # drafts were kept (a tenth of the answer at least: 15 to 30 on the CPUs seen): the equality is not
    # the plain loop's by default
    assert stats.draft_accepted >= 12
    assert stats.extra["draft_alone"] > 0  # and the rule decided near-ties one token at a time
