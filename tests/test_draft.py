"""The n-gram drafter on token lists (engine/draft.py), and the draft options' checks: no model."""

from __future__ import annotations

import pytest

from localinfer.engine import draft as d
from localinfer.engine import draft_costs as dc
from localinfer.engine.draft import NgramDrafter, acceptance, check
from localinfer.engine.types import LoadOptions
from localinfer.errors import UsageError


def _priced(per_row: float) -> d.DraftCosts:
    """Costs measured (TRUST_AFTER drafted steps) where a plain step takes 20 ms and a row ``per_row``."""
    costs = d.DraftCosts()
    costs.observe(1, 0.020)
    for _ in range(dc.TRUST_AFTER):
        costs.observe(d.MAX_DRAFT_LIMIT + 1, 0.020 + d.MAX_DRAFT_LIMIT * per_row)
    return costs


def cheap() -> d.DraftCosts:
    """The costs of a machine where a drafted token adds little to a step: every draft pays."""
    return _priced(0.0001)


def test_lookup_proposes_what_followed_the_longest_match():
    # "7 8 9" occurs once, followed by 1 2 3; the bare "8 9" also occurs later, followed by 5
    seq = [7, 8, 9, 1, 2, 3, 4, 8, 9, 5, 6, 0, 7, 8, 9]
    drafter = NgramDrafter(seq, max_draft=4)
    n, tokens = drafter.lookup(4)
    assert (n, tokens) == (3, [1, 2, 3, 4])


def test_lookup_takes_the_latest_occurrence_of_the_same_match():
    seq = [1, 2, 10, 11, 1, 2, 20, 21, 1, 2]
    assert NgramDrafter(seq).lookup(2) == (2, [20, 21])


def test_the_end_of_the_sequence_never_matches_itself():
    assert NgramDrafter([1, 2, 3, 4, 5]).lookup(4) == (0, [])
    assert NgramDrafter([]).propose() == []


def test_a_single_token_match_is_not_enough():
    # only the 1-gram "3" recurs: too weak a match to spend a batch on
    assert NgramDrafter([3, 1, 9, 3]).lookup(4) == (0, [])


def test_answer_tokens_extend_the_index_as_they_come():
    drafter = NgramDrafter([5, 6, 7, 8, 9], max_draft=3, costs=cheap())
    assert drafter.propose() == []
    drafter.extend([5, 6])
    assert drafter.propose() == [7, 8, 9]
    drafter.feedback(2, 1)  # the engine verified two of them (a constraint cut the third)
    assert (drafter.drafted, drafter.accepted, drafter.drafts) == (2, 1, 1)


def test_propose_respects_the_limit_and_the_draft_cap():
    drafter = NgramDrafter(list(range(40)) + [0, 1], max_draft=8, costs=cheap())
    assert drafter.propose(limit=3) == [2, 3, 4]
    assert drafter.propose() == list(range(2, 10))
    assert drafter.propose(limit=0) == []


def test_rejections_shorten_drafts_and_acceptance_lengthens_them():
    drafter = NgramDrafter(list(range(40)) + [0, 1], max_draft=8, costs=cheap())
    assert len(drafter.propose()) == 8
    drafter.feedback(8, 2)
    assert len(drafter.propose()) == 3  # what was kept, plus one
    drafter.feedback(3, 3)
    assert len(drafter.propose()) == 6  # doubled
    assert (drafter.drafted, drafter.accepted) == (11, 5)


def test_misses_in_a_row_pause_drafting_for_longer_each_time():
    drafter = NgramDrafter([1, 2, 3, 4] * 3 + [1, 2], max_draft=4, costs=cheap())
    for _ in range(d.MISSES_TO_PAUSE):
        draft = drafter.propose()
        assert draft
        drafter.feedback(len(draft), 0)
    assert drafter.paused and drafter.propose() == []
    drafter.extend([9] * d.FIRST_PAUSE)  # tokens of a plain decode go by
    drafter.extend([1, 2])
    assert not drafter.paused and drafter.propose()
    for _ in range(d.MISSES_TO_PAUSE):
        drafter.feedback(1, 0)
    drafter.extend([9] * d.FIRST_PAUSE)
    assert drafter.paused  # the second pause is twice as long


def test_a_kept_token_ends_the_run_of_misses():
    drafter = NgramDrafter([1, 2, 3, 4] * 3 + [1, 2], max_draft=4)
    for _ in range(5):
        drafter.feedback(4, 0)
        drafter.feedback(4, 1)
    assert not drafter.paused


def _timed(drafter: NgramDrafter, single: float, per_token: float) -> None:
    for _ in range(20):
        drafter.observe(1, single)
    for _ in range(20):
        drafter.observe(9, single + 8 * per_token)


def test_where_a_batch_costs_nearly_one_token_each_drafts_stop():
    # a compute-bound machine: 8 drafted tokens cost 7 plain steps; a 60% guess cannot pay
    drafter = NgramDrafter(list(range(40)) + [0, 1], max_draft=8)
    _timed(drafter, 0.010, 0.009)
    assert drafter.worth(2, 8) == 0
    assert drafter.propose() == []


def test_where_a_batch_is_cheap_the_whole_draft_pays():
    drafter = NgramDrafter(list(range(40)) + [0, 1], max_draft=8)
    _timed(drafter, 0.020, 0.002)
    for _ in range(10):  # long matches were all kept so far
        drafter._last_n = 5
        drafter.feedback(8, 8)
    assert drafter.worth(5, 8) == 8
    assert drafter.worth(5, 3) == 3


def test_low_acceptance_asks_for_short_drafts_or_none():
    drafter = NgramDrafter(list(range(40)) + [0, 1], max_draft=8)
    _timed(drafter, 0.020, 0.004)
    for _ in range(20):
        drafter._last_n = 2
        drafter.feedback(4, 0)
    assert drafter.rate(2) < 0.15
    assert drafter.worth(2, 8) == 0
    # untried match lengths start from the sequence's rate (low here), and learn their own
    assert drafter.rate(5) < 0.2
    for _ in range(5):
        drafter._last_n = 5
        drafter.feedback(4, 4)
    assert drafter.rate(5) > 0.7 and drafter.rate(2) < drafter.rate(5) / 2


def test_plain_steps_that_would_have_copied_bring_drafting_back():
    # a drafted token costs 0.6 of a step: only a guess kept ~70% of the time pays
    drafter = NgramDrafter(list(range(100)) + [0, 1, 2], max_draft=8)
    _timed(drafter, 0.010, 0.006)
    for _ in range(20):  # the last guesses all missed (where an answer stopped copying)
        drafter._last_n = 3
        drafter.feedback(4, 0)
    drafter.extend([200] * (2 * d.MAX_PAUSE))  # past any pause, nothing to copy
    drafter.extend([0, 1, 2])  # the answer copies again: plain steps give the guessed tokens
    drafted_after = None
    for step, token in enumerate(range(3, 60)):
        if drafter.propose():
            drafted_after = step
            break
        drafter.extend([token])
    assert drafted_after is not None and drafted_after <= 12
    assert drafter.drafted == 80  # the free tries verified nothing


def test_after_many_plain_steps_a_short_draft_measures_again():
    drafter = NgramDrafter(list(range(40)) + [0, 1], max_draft=8)
    _timed(drafter, 0.010, 0.009)
    assert drafter.worth(2, 8) == 0
    for _ in range(dc.EXPLORE_EVERY):
        drafter.observe(1, 0.010)
    assert drafter.worth(2, 8) == dc.EXPLORE_DRAFT


def test_until_a_drafted_token_is_timed_drafts_are_short():
    # the first drafts measure what a drafted token costs: a long one could cost k plain steps
    # and before that, one plain step measures what the drafted rows would add to
    drafter = NgramDrafter(list(range(40)) + [0, 1], max_draft=8)
    assert drafter.propose() == []
    drafter.observe(1, 0.010)
    assert drafter.propose() == [2, 3][: dc.EXPLORE_DRAFT]
    drafter.observe(1 + dc.EXPLORE_DRAFT, 0.0105)
    assert len(drafter.propose()) > dc.EXPLORE_DRAFT  # cheap here: longer drafts pay


def test_one_delayed_first_draft_does_not_stop_drafting():
    # the first verified draft ran while another process had the core (10 plain steps' time):
    # drafting goes on with short drafts until TRUST_AFTER were timed, and the least time counts
    drafter = NgramDrafter(list(range(40)) + [0, 1], max_draft=8)
    drafter.observe(1, 0.010)
    drafter.observe(1 + dc.EXPLORE_DRAFT, 0.100)
    assert drafter.propose() == [2, 3][: dc.EXPLORE_DRAFT]
    for _ in range(dc.TRUST_AFTER - 1):
        drafter.observe(1 + dc.EXPLORE_DRAFT, 0.0105)
    assert drafter.costs.step(1 + dc.EXPLORE_DRAFT) - drafter.costs.step(1) == pytest.approx(0.0005)
    assert len(drafter.propose()) > dc.EXPLORE_DRAFT


def test_a_timed_draft_size_is_priced_by_its_own_time():
    # 2 drafted tokens cost little, 8 cost as much as 8 steps (a kernel that changes with the rows):
    # the model prices each size by what it measured, and 2 is what pays
    costs = d.DraftCosts()
    for _ in range(5):
        costs.observe(1, 0.010)
        costs.observe(3, 0.011)
        costs.observe(9, 0.090)
    assert costs.step(3) == pytest.approx(0.011) and costs.step(9) == pytest.approx(0.090)
    drafter = NgramDrafter(list(range(40)) + [0, 1], max_draft=8, costs=costs)
    for _ in range(10):
        drafter._last_n = 5
        drafter.feedback(8, 8)
    assert drafter.worth(5, 8) == 2


def test_a_step_is_priced_by_its_rows():
    # four sequences decode in 40 ms; a step that also verified 4 drafted tokens took 48 ms: 2 ms a
    # drafted row; sizes not timed are interpolated, or extended by that
    costs = d.DraftCosts()
    costs.observe(4, 0.040, n_seqs=4)
    costs.observe(8, 0.048, n_seqs=4)
    assert costs.step(4) == pytest.approx(0.040) and costs.step(8) == pytest.approx(0.048)
    assert costs.per_row == pytest.approx(0.002)
    assert costs.step(6) == pytest.approx(0.044) and costs.step(10) == pytest.approx(0.052)


def _four(rate: float, rate2: float | None = None) -> list[int]:
    """choose for four sequences, each offering 8 tokens, at the costs measured on a 2-core EPYC
    (SmolLM2 Q4_1, 2 threads, every sequence drafting alike, CPU ms: benchmarks/results/draft-rows-2026-12-04.txt)."""
    costs = d.DraftCosts()
    for rows, ms in ((4, 64.3), (8, 100.3), (12, 143.1), (16, 189.9)):
        for _ in range(dc.TRUST_AFTER):
            costs.observe(rows, ms / 1000, n_seqs=4)
    rates = [rate, rate, rate, rate if rate2 is None else rate2]
    return costs.choose(4, [(a, 8) for a in rates]).counts


def test_a_batch_drafts_where_its_tokens_per_second_rise():
    # a drafted row next to four sequences' tokens costs what a fifth row costs (4.5-5.8 ms here), not
    # what a row alone does (11 ms): guesses kept 95% of the time pay, a few tokens each
    assert 4 <= min(_four(0.95)) and max(_four(0.95)) < 8  # the last rows of a guess are not worth it
    assert _four(0.6) == [0, 0, 0, 0]
    # the rows go to the likeliest guesses first: a sequence whose guesses miss gets none
    wants = _four(0.95, 0.2)
    assert wants[3] == 0 and min(wants[:3]) >= 2


def test_a_minimum_draft_raises_short_drafts_or_drafts_none():
    # llama-server's speculative.n_min: the cost model's 2 tokens become 4; a 3-token match, none
    costs = cheap()
    drafter = NgramDrafter(list(range(40)) + [0, 1], max_draft=8, costs=costs, min_draft=4)
    drafter.size = 1
    assert drafter.propose() == [2, 3, 4, 5]
    assert drafter.propose(limit=3) == []
    assert NgramDrafter([5, 7, 8, 9, 7, 8], max_draft=8, costs=cheap(), min_draft=4).propose() == []  # [9, 7, 8]


def test_serve_takes_llama_servers_draft_fields():
    from localinfer.serve.wires.openai import ApiError, parse_request

    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert (parse_request(body, "chat").draft_max, parse_request(body, "chat").draft_min) == (None, 0)
    got = parse_request({**body, "speculative.n_max": 0, "speculative.n_min": 3}, "chat")
    assert (got.draft_max, got.draft_min) == (0, 3)
    for bad in (-1, d.MAX_DRAFT_LIMIT + 1, 2.5, "4", True):
        with pytest.raises(ApiError, match="speculative.n_max"):
            parse_request({**body, "speculative.n_max": bad}, "chat")


def test_stop_ends_drafting_for_good():
    drafter = NgramDrafter([1, 2, 3, 1, 2], max_draft=4)
    drafter.stop()
    for _ in range(100):  # the guesses a plain step scores come true, and still nothing is drafted
        assert drafter.propose() == []
        drafter.extend([3, 1, 2])
    assert drafter.propose() == []


def test_acceptance_line():
    assert acceptance(100, 74) == "draft 74% accepted"
    assert acceptance(0, 0) == "draft none"


@pytest.mark.parametrize(
    "args, message",
    [
        (("ngram", None, "smollm2"), "--draft and --draft-model are two ways to guess"),
        ((None, None, " "), "--draft-model needs the name"),
        (("bogus", None, None), "--draft takes ngram"),
        (("ngram", 0, None), "--draft-max must be between 1"),
        (("ngram", d.MAX_DRAFT_LIMIT + 1, None), "--draft-max must be between 1"),
    ],
)
def test_bad_draft_settings_are_refused(args, message):
    with pytest.raises(UsageError, match=message):
        check(*args)
    with pytest.raises(UsageError, match=message):
        LoadOptions(draft=args[0], draft_max=args[1], draft_model=args[2])


def test_good_draft_settings_pass():
    check("ngram", 16, None)
    assert LoadOptions(draft="ngram", draft_max=4).draft_max == 4
    assert LoadOptions().draft is None


@pytest.mark.llama  # the CLI asks llama.cpp whether the build offloads before it refuses
def test_cli_refuses_a_draft_model_where_sequences_share_a_context_and_a_lone_draft_max(tmp_path):
    from typer.testing import CliRunner

    from localinfer.cli.main import build_app

    runner, app = CliRunner(), build_app()
    for command in (["serve"], ["batch", str(tmp_path / "in.jsonl")], ["bench"]):
        out = runner.invoke(app, [*command, "-m", str(tmp_path / "none.gguf"), "--draft-model", "x"])
        assert out.exit_code == 2, out.output
        assert f"{command[0]} does not take --draft-model yet" in out.output and "--draft ngram" in out.output
    out = runner.invoke(app, ["run", "-m", str(tmp_path / "none.gguf"), "--draft", "ngram", "--draft-model", "x", "hi"])
    assert out.exit_code == 2 and "give one of them" in out.output
    out = runner.invoke(app, ["run", "-m", str(tmp_path / "none.gguf"), "--draft-model", "x", "--keep-alive", "5m", "hi"])
    assert out.exit_code == 2 and "--keep-alive does not take --draft-model" in out.output  # the resident server batches
    out = runner.invoke(app, ["run", "-m", str(tmp_path / "none.gguf"), "--draft-max", "4", "hi"])
    assert out.exit_code == 2 and "--draft-max needs --draft ngram" in out.output


def test_stats_lines_say_how_much_was_accepted():
    from localinfer.answer.answer import Answer
    from localinfer.engine.types import GenerationStats
    from localinfer.render.chat import turn_line
    from localinfer.render.stats import summary_line

    drafted = Answer("x", "m", GenerationStats(completion_tokens=9, draft="ngram", draft_tokens=100, draft_accepted=74), 0.0)
    plain = Answer("x", "m", GenerationStats(completion_tokens=9), 0.0)
    assert "· draft 74% accepted ·" in summary_line(drafted) and "draft" not in summary_line(plain)
    assert "· draft 74% accepted ·" in turn_line(drafted) and "draft" not in turn_line(plain)
    assert drafted.to_json()["timings"]["draft_accepted_tokens"] == 74
    assert plain.to_json()["timings"]["draft_tokens"] is None


class _FakeDraftModel:
    """A draft model's stand-in: guesses the next integers, each guess taking ``step`` seconds."""

    def __init__(self, step: float = 0.0, n_ctx: int = 4096) -> None:
        import types

        self.model, self.step, self.synced, self.asked = types.SimpleNamespace(n_ctx=n_ctx), step, [], []

    def sync(self, tokens, logits=False):
        self.synced.append(len(tokens))

    def guess(self, tokens, k):
        import time

        self.asked.append(k)
        end = time.process_time() + self.step * k  # CPU time, as a draft model's guessing costs it
        while time.process_time() < end:
            pass
        return [tokens[-1] + i + 1 for i in range(k)]


@pytest.mark.llama  # engine.draft_model loads libllama (its DraftModel); these use a stand-in
def test_model_drafter_steps_plainly_first_then_counts_the_draft_models_time():
    from localinfer.engine.draft_model import ModelDrafter

    source = _FakeDraftModel(step=0.01)
    drafter = ModelDrafter(source, [1, 2, 3], max_draft=8)
    assert source.synced == [3]  # the prompt is read before the first token
    drafter.extend([4])
    assert drafter.propose() == []  # no plain step timed yet: nothing to compare a draft with
    drafter.observe(1, 0.020)
    drafter.extend([5])
    assert drafter.propose() == [6, 7] and source.asked == [2]  # a short draft measures a drafted token
    drafter.observe(3, 0.024)  # the target's batch: 4 ms over a plain step for 2 tokens...
    drafter.feedback(2, 2)
    assert drafter.costs.per_row >= (0.024 + 0.02 - 0.020) / 2 * 0.99  # ...plus the guesses' 2 x 10 ms
    assert drafter.kind == "model"


@pytest.mark.llama  # engine.draft_model loads libllama (its DraftModel); these use a stand-in
def test_model_drafter_stops_where_guesses_cost_a_full_step_and_at_the_drafts_context():
    from localinfer.engine.draft_model import ModelDrafter

    drafter = ModelDrafter(_FakeDraftModel(), [1, 2, 3], max_draft=8, costs=cheap())
    assert drafter.propose() == []  # the answer's first step is plain
    drafter.costs = _priced(0.030)  # each guessed token costs more than a plain step (20 ms)
    drafter.extend([4])
    assert drafter.propose() == []
    drafter.costs = _priced(0.0001)
    assert drafter.propose() == [5, 6, 7, 8, 9, 10, 11, 12]
    small = ModelDrafter(_FakeDraftModel(n_ctx=6), [1, 2, 3], max_draft=8, costs=cheap())
    small.extend([4])
    assert small.propose() == []  # plain
    assert small.propose(8) == [] and small.propose(1) == [5]  # 4 + 1 tokens fit in 6, 4 + 8 do not


@pytest.mark.llama  # engine.draft_model loads libllama (its DraftModel); these use a stand-in
def test_model_drafter_times_a_plain_step_again_now_and_then():
    from localinfer.engine import draft_model as dm

    drafter = dm.ModelDrafter(_FakeDraftModel(), [1, 2, 3], max_draft=4, costs=cheap())
    steps = []
    for _ in range(2 * dm.PLAIN_EVERY + 3):
        draft = drafter.propose()
        steps.append(bool(draft))
        if draft:
            drafter.feedback(len(draft), len(draft))
        drafter.extend([drafter.tokens[-1] + 1, *draft])
    # plain, PLAIN_EVERY drafts, plain, PLAIN_EVERY drafts, plain
    assert [i for i, s in enumerate(steps) if not s] == [0, dm.PLAIN_EVERY + 1, 2 * (dm.PLAIN_EVERY + 1)]


@pytest.mark.llama  # engine.batch_draft imports engine.speculate, which loads libllama
def test_a_batch_plan_gives_every_id_of_its_block_as_many_rows():
    import types

    from localinfer.engine.batch_draft import plan

    costs = d.DraftCosts()  # five rows (five ids' tokens) 40 ms; each row more 1 ms
    costs.observe(5, 0.040, n_seqs=5)
    for _ in range(dc.TRUST_AFTER):
        costs.observe(5 + 40, 0.040 + 40 * 0.001, n_seqs=5)

    def slot(seq: int, rate: float, history=None, prompt=None):
        drafter = NgramDrafter(history or list(range(40)) + [0, 1], max_draft=8, costs=costs)
        drafter._kept, drafter._tried = dict.fromkeys(range(2, 6), 100 * rate), dict.fromkeys(range(2, 6), 100.0)
        return types.SimpleNamespace(seq=seq, shift=0, prompt=prompt, drafter=drafter, pos=50, max_tokens=None, n_gen=0,
                                     limiter=None, draft=[], pad=0)  # fmt: skip

    def rows(s) -> int:
        return len(s.draft) + s.pad

    # ids 0, 1, 3, 4 decode (id 1's guess has 3 tokens), id 2 is idle: llama.cpp decodes the step in
    # one pass only where every id has as many rows, so the short draft and the idle id are padded
    copying, short, other, likely = slot(0, 0.95), slot(1, 0.95, [1, 2, 9, 1, 2]), slot(3, 0.95), slot(4, 0.8)
    active = [copying, short, other, likely]
    total, layout = plan(active, room=64, n_ctx_seq=1024, filler_pos=lambda seq: 0)
    assert (layout.lo, layout.hi) == (0, 4) and layout.width >= 4
    assert short.draft == [9, 1, 2] and copying.draft == other.draft == list(range(2, 2 + layout.width))
    assert {rows(s) for s in active} == {layout.width} and short.pad == layout.width - 3
    assert total == 5 * layout.width  # the idle id's filler row gets as many more
    # no pass for a block wider than the batch's room; a prefilling id cannot be padded, so a block
    # stays on one side of it
    total, layout = plan(active, room=10, n_ctx_seq=1024, filler_pos=lambda seq: 0)
    assert total <= 10 and layout.width <= 2
    starting = slot(2, 0.95, prompt=[1, 2])
    active = [copying, short, starting, other, likely]
    total, layout = plan(active, room=64, n_ctx_seq=1024, filler_pos=lambda seq: 0)
    assert starting.draft == [] and starting.pad == 0 and not layout.lo <= 2 <= layout.hi
    assert {rows(s) for s in active if layout.lo <= s.seq <= layout.hi} == {layout.width}
    assert all(rows(s) == 0 for s in active if not layout.lo <= s.seq <= layout.hi)
    assert plan(active, room=64, n_ctx_seq=52, filler_pos=lambda seq: 0)[0] == 0  # the sequences' context is full


def test_a_layout_pays_for_its_passes():
    # four ids at the costs measured here: one pass of 4 rows 64 ms; where one sequence's guesses
    # are kept and three have none, a pass of its own (4 + 4 rows: 2 passes, 128 ms) beats padding
    # every id to its width (20 rows, 190+ ms); where three copy, padding the fourth wins
    costs = d.DraftCosts()
    for n_rows, ms in ((4, 64.3), (8, 100.3), (12, 143.1), (16, 189.9)):
        for _ in range(dc.TRUST_AFTER):
            costs.observe(n_rows, ms / 1000, n_seqs=4)
    one = costs.choose(4, [(0.99, 8)], at=[1], caps=[100] * 4)
    assert (one.lo, one.hi) == (1, 1) and one.counts[0] == one.width >= 4
    three = costs.choose(4, [(0.95, 8)] * 3, at=[0, 1, 3], caps=[100] * 4)
    assert (three.lo, three.hi) == (0, 3)
