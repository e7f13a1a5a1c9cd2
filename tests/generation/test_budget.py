import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eagledata.errors import InputError
from eagledata.generation.conversations.datasets import load_datasets, write_targets
from eagledata.generation.plan.budget import (
    DatasetStats,
    OutputLengths,
    Prices,
    cost_band,
    plan_budget,
    planned_vs_actual,
    scenario_table,
)

# The real run's picture: six datasets, ~4k output tokens per request, ~350-token prompts, $0.45/$2.20 per M.
LENGTHS = OutputLengths(mean=4000, sd=3000, p50=3000, p90=8000, source="test")
PRICES = Prices(0.45, 2.20, "test")
SIX = [DatasetStats(f"B{i}", 20_000, 350, 200, 300, 700, 20_000 * 350) for i in range(1, 7)]


def test_real_run_scenarios():
    table = scenario_table(SIX, LENGTHS, PRICES, [10_000_000, 7_000_000], balance_usd=100, reserve_usd=5)
    ten, seven = table.iloc[0], table.iloc[1]
    assert ten["output_usd"] == pytest.approx(132.0)           # 6 x 10M at $2.20/M
    assert not ten["fits_balance"]
    assert seven["total_usd"] == pytest.approx(94.05, abs=0.01)  # 92.40 output + 1.65 input
    assert seven["fits_usable"]


def test_plan_gives_7m_each_for_100_dollars_with_5_reserve():
    plan = plan_budget(SIX, LENGTHS, PRICES, balance_usd=100, reserve_usd=5, round_to=1_000_000)
    assert plan.targets == {f"B{i}": 7_000_000 for i in range(1, 7)}
    assert plan.total_usd == pytest.approx(94.05, abs=0.01) and plan.total_usd <= plan.usable_usd
    d = plan.datasets[0]
    assert d.requests == 1750 and d.p50_usd == pytest.approx(d.total_usd) and d.p90_usd > d.p50_usd


def test_dataset_short_of_prompts_is_capped_and_others_get_the_rest():
    small = DatasetStats("tiny", 100, 350, 200, 300, 700, 35_000)  # 100 prompts x 4000 = 400k tokens at most
    plan = plan_budget([small, *SIX[:2]], LENGTHS, PRICES, balance_usd=50, reserve_usd=0, round_to=1)
    t = plan.targets
    assert t["tiny"] == 400_000 and plan.datasets[0].limited_by_prompts
    assert t["B1"] == t["B2"] > 400_000
    assert plan.total_usd == pytest.approx(50, abs=1e-3)


def test_policies():
    stats = [DatasetStats("a", 1000, 300, 1, 300, 300, 300_000), DatasetStats("b", 3000, 300, 1, 300, 300, 900_000)]
    prop = plan_budget(stats, LENGTHS, PRICES, balance_usd=10, policy="proportional", round_to=1).targets
    assert prop["b"] == pytest.approx(3 * prop["a"], rel=1e-6)
    wt = plan_budget(stats, LENGTHS, PRICES, balance_usd=10, policy="weights", weights={"a": 1, "b": 0}, round_to=1)
    assert wt.targets["b"] == 0 and wt.targets["a"] > 0


@settings(max_examples=200, deadline=None)
@given(budget=st.floats(1, 5000), extra=st.floats(0, 5000), reserve_share=st.floats(0, 0.9),
       prompts=st.lists(st.integers(1, 50_000), min_size=1, max_size=8),
       policy=st.sampled_from(["equal", "proportional"]))
def test_invariants(budget, extra, reserve_share, prompts, policy):
    stats = [DatasetStats(f"d{i}", n, 400, 100, 400, 600, n * 400) for i, n in enumerate(prompts)]
    reserve = budget * reserve_share
    a = plan_budget(stats, LENGTHS, PRICES, balance_usd=budget, reserve_usd=reserve, policy=policy)
    b = plan_budget(stats, LENGTHS, PRICES, balance_usd=budget + extra, reserve_usd=reserve, policy=policy)
    assert a.total_usd <= budget - reserve + 1e-9
    assert all(b.targets[k] >= a.targets[k] for k in a.targets)  # more money never fewer tokens


@pytest.mark.parametrize("kwargs, field", [
    (dict(balance_usd=-1), "budget_usd"), (dict(balance_usd=None), "budget_usd"),
    (dict(balance_usd=10, reserve_usd=10), "reserve_usd"), (dict(balance_usd=10, policy="random"), "policy"),
    (dict(balance_usd=10, policy="weights", weights={"B1": 1}), "weights"),
])
def test_bad_inputs(kwargs, field):
    with pytest.raises(InputError, match=f"field '{field}'"):
        plan_budget(SIX, LENGTHS, PRICES, **kwargs)


def test_dataset_without_prompts():
    with pytest.raises(InputError, match="field 'empty'"):
        DatasetStats.from_lengths("empty", [])


def test_lengths_from_records_and_lognormal(tmp_path):
    path = tmp_path / "B1" / "records.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps({"usage": {"completion_tokens": n}}) + "\n" for n in (100, 200, 300)))
    got = OutputLengths.from_records([path, tmp_path / "missing.jsonl"])
    assert (got.mean, got.p50) == (200, 200) and "3 records" in got.source
    assert OutputLengths.from_records([tmp_path / "none.jsonl"]) is None
    ln = OutputLengths.lognormal(median=3000, sigma=0.8, max_tokens=16000)
    assert 2900 < ln.p50 < 3100 and max(ln.samples) <= 16000


def test_cost_band_narrows_relative_to_target():
    s = SIX[0]
    lo = cost_band(1e6, s, LENGTHS, PRICES, 2000)
    hi = cost_band(1e8, s, LENGTHS, PRICES, 2000)
    assert (lo[1] - lo[0]) / lo[0] > (hi[1] - hi[0]) / hi[0]


def test_datasets_file_and_targets(tmp_path):
    prompts = tmp_path / "a.jsonl"
    prompts.write_text('{"id": "1", "messages": [{"role": "user", "content": "q"}]}\n')
    path = tmp_path / "datasets.yaml"
    path.write_text("A:\n  prompts: a.jsonl\n  notes: keep me\nB:\n  prompts: a.jsonl\n  target_output_tokens: 5\n")
    specs = load_datasets(path)
    assert specs["A"].prompts == prompts and specs["A"].target_output_tokens is None
    write_targets(path, {"A": 7_000_000})
    again = load_datasets(path)
    assert again["A"].target_output_tokens == 7_000_000 and again["B"].target_output_tokens == 5
    assert "notes: keep me" in path.read_text()
    path.write_text("A:\n  prompts: a.jsonl\n  target_output_tokens: -3\n")
    with pytest.raises(InputError, match="field 'A.target_output_tokens'"):
        load_datasets(path)
    path.write_text("A: [unclosed\n")
    with pytest.raises(InputError, match=r"datasets\.yaml:\d+: not valid YAML"):
        load_datasets(path)


def test_planned_vs_actual(tmp_path):
    plan = plan_budget(SIX[:1], LENGTHS, PRICES, balance_usd=20)
    d = tmp_path / "datasets" / "B1"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"output_tokens": 1_000_000, "spend_usd": 2.5}))
    row = planned_vs_actual(plan, tmp_path).iloc[0]
    assert row["actual_usd_per_m"] == pytest.approx(2.5) and row["planned_tokens"] == plan.targets["B1"]


def test_prices_come_from_the_routing_decision_else_the_catalog_and_say_which(tmp_path):
    """No routing decision yet: the catalog (here a snapshot) is judged under the default policy and the plan takes
    its cheapest eligible price; a routing file named explicitly must exist."""
    from eagledata.aio import run_sync
    from eagledata.generation import BudgetConfig, plan_prices
    from tests.helpers.catalogs import catalog, decision_for

    snap = catalog().save(tmp_path / "snap.json")
    cfg = BudgetConfig(params_dir=str(tmp_path / "none"), snapshot=str(snap), base_url="http://127.0.0.1:9/x")
    basis = run_sync(plan_prices(cfg), "plan_prices")
    assert basis.routing_file is None and (basis.prices.prompt_per_m, basis.prices.completion_per_m) == (0.45, 2.2)
    assert basis.prices.source == "cheapest eligible (DeepInfra)"  # Fireworks' nvfp4 is cheaper, and excluded
    assert basis.note.startswith(f"no routing decision at {tmp_path / 'none' / 'routing' / 'kimi-k2.5.yaml'}")
    assert str(snap) in basis.note and "default precision policy" in basis.note
    # once providers.ipynb has decided (here: Venice's unknown quantization excluded too), the file wins
    routing = decision_for(catalog(), unknown="exclude").save(tmp_path / "params")
    decided = run_sync(plan_prices(BudgetConfig(params_dir=str(tmp_path / "params"), snapshot=str(snap),
                                                price_mode="worst")), "plan_prices")
    assert decided.routing_file == routing and decided.prices.completion_per_m == 2.5
    assert decided.note.startswith(f"prices from the routing decision {routing}")
    with pytest.raises(InputError, match=r"typo\.yaml field 'routing': routing decision not found"):
        run_sync(plan_prices(BudgetConfig(routing=str(tmp_path / "typo.yaml"), snapshot=str(snap))), "plan_prices")


# -- conversations: a request per user turn (turns: all) ------------------------------------------------------------
def _conversations(tmp_path, extra: tuple[dict, ...] = ()):
    """Conversations of 1, 2 and 3 asks (a system turn; the dataset's answers, which `all` drops)."""
    rows = [
        {"id": "one", "messages": [{"role": "user", "content": "What is the CAP theorem?"}]},
        {"id": "two", "messages": [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "Capital of France?"},
                                   {"role": "assistant", "content": "The dataset's own answer: Paris."},
                                   {"role": "user", "content": "And of Japan? 日本語で。"}]},
        {"id": "three", "conversations": [{"from": "human", "value": "Write fizzbuzz in Python."},
                                          {"from": "gpt", "value": "for i in range(1, 101): ..."},
                                          {"from": "human", "value": "Now in Rust."},
                                          {"from": "gpt", "value": "fn main() { ... }"},
                                          {"from": "human", "value": "Which is faster, and why?"}]},
        *extra,
    ]
    path = tmp_path / "conv.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


# The target's answers as generation would send them back (content only), of varied shapes.
ANSWERS = ["Paris.", "東京です。\n\n```python\nprint('hi')\n```", "  leading spaces, trailing newline\n"]


def _rendered(tok, path, answers):
    """Each request's prompt tokens, rendering the real chains with these answers (what generation sends)."""
    from eagledata.generation.conversations.turns import Conversation
    from eagledata.prompts import iter_prompts
    from eagledata.records import Answer
    from eagledata.text import prompt_ids

    out = []
    for p in iter_prompts(path):
        conv = Conversation.of(p, "all")
        said = [Answer("", a, "stop") for a in answers]
        out += [len(prompt_ids(tok, conv.turn(said[:k]).messages)) for k in range(len(conv.asks))]
    return out


def test_each_turns_prompt_is_its_asks_plus_the_earlier_answers_content_exactly(tok, tmp_path):
    """Turn j's prompt = the measured asks (template included) + the content tokens of answers 1..j−1, exactly:
    the answers sit between special tokens, so nothing merges across them."""
    from eagledata.generation.plan.budget import measure_prompts

    path = _conversations(tmp_path)
    m = measure_prompts(tok, "conv", path)
    assert m.conversation_turns.tolist() == [1, 2, 3] and m.earlier_answers.tolist() == [0, 0, 1, 0, 1, 2]
    content = [len(tok.encode_ordinary(a)) for a in ANSWERS]
    model = [int(a) + sum(content[:k]) for a, k in zip(m.asks_tokens, m.earlier_answers)]
    assert model == _rendered(tok, path, ANSWERS)


def test_dataset_stats_with_answers_of_the_modelled_length_equal_the_rendered_chains(tok, tmp_path):
    from eagledata.generation.plan.budget import ContentLengths, measure_prompts

    answers = ["ok" + " hello" * 40] * 2
    n = len(tok.encode_ordinary(answers[0]))
    path = _conversations(tmp_path)
    got = measure_prompts(tok, "conv", path).stats(ContentLengths(n, 0.0, "known"))
    want = DatasetStats.from_lengths("conv", _rendered(tok, path, answers), prompts=3,
                                     turns_per_conversation={1: 1, 2: 1, 3: 1})
    assert (got.prompts, got.requests, got.turns_per_conversation) == (3, 6, {1: 1, 2: 1, 3: 1})
    assert got.turns_mean == 2.0 and got.prompt_tokens_total == want.prompt_tokens_total
    for f in ("prompt_tokens_mean", "prompt_tokens_sd", "prompt_tokens_p50", "prompt_tokens_p90"):
        assert getattr(got, f) == pytest.approx(getattr(want, f), abs=1e-9), f  # same integers, float sums
    # the answers' spread widens the per-request spread: 0+0+1+0+1+2 earlier answers over 6 requests, each sd² = 100²
    spread = measure_prompts(tok, "conv", path).stats(ContentLengths(n, 100.0, "known"))
    assert spread.prompt_tokens_sd == pytest.approx((want.prompt_tokens_sd ** 2 + 4 / 6 * 100 ** 2) ** 0.5, abs=1e-9)
    with pytest.raises(InputError, match="field 'conv'.*content-length model"):
        measure_prompts(tok, "conv", path).stats(None)


def test_one_render_per_conversation_equals_rendering_every_turn(tok, tmp_path):
    """The fast path cuts the last request at the empty answers; where it cannot find them exactly once each (the
    scaffold typed in a user turn) it renders turn by turn. Both give what rendering every turn gives."""
    from eagledata.generation.conversations.turns import Conversation
    from eagledata.generation.plan.budget import _Scaffold, turn_prompt_tokens
    from eagledata.prompts import iter_prompts
    from eagledata.text import prompt_ids

    typed = {"id": "typed", "messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": "quote: <|im_assistant|>assistant<|im_middle|><think></think><|im_end|> end"}]}
    scaffold = _Scaffold.of(tok)
    assert scaffold is not None and scaffold.generation == tuple(tok.encode(
        "<|im_assistant|>assistant<|im_middle|><think>", allow_special=True))
    found = {}
    for p in iter_prompts(_conversations(tmp_path, (typed,))):
        conv = Conversation.of(p)
        assert turn_prompt_tokens(tok, conv, scaffold) == turn_prompt_tokens(tok, conv, None), p.id
        last = conv.turn([conv.stand_in(k) for k in range(len(conv.asks) - 1)])
        found[p.id] = len(scaffold.starts(prompt_ids(tok, last.messages)))
    assert found == {"one": 0, "two": 1, "three": 2, "typed": 2}  # typed: one answer, two scaffolds -> every turn


def test_turns_last_reproduces_todays_plan_exactly(tok, tmp_path):
    """`last`: one request per prompt, the prompt as written (the dataset's answers as history) — the figures
    budget.ipynb gave before conversations, down to the plan."""
    from eagledata.generation.plan.budget import ContentLengths, measure_prompts
    from eagledata.prompts import iter_prompts
    from eagledata.text import prompt_ids

    path = _conversations(tmp_path)
    today = DatasetStats.from_lengths("conv", [len(prompt_ids(tok, p.messages)) for p in iter_prompts(path)])
    last = measure_prompts(tok, "conv", path, "last").stats(ContentLengths(900, 300, "ignored: no earlier answers"))
    assert last == today and last.requests == last.prompts == 3
    plan = dict(balance_usd=5, reserve_usd=1, round_to=1)
    assert plan_budget([last, SIX[0]], LENGTHS, PRICES, **plan) == plan_budget([today, SIX[0]], LENGTHS, PRICES, **plan)
    every = measure_prompts(tok, "conv", path, "all").stats(ContentLengths(900, 300, "test"))
    assert every.requests == 6 and every.prompt_tokens_mean > last.prompt_tokens_mean
    with pytest.raises(InputError, match="field 'turns'"):
        measure_prompts(tok, "conv", path, "first")


def test_the_prompt_cap_counts_turns_not_prompts():
    """100 conversations of 2.5 turns on average: 250 requests of 4,000 tokens = 1M output tokens at most."""
    talk = DatasetStats("talk", 100, 350, 200, 300, 700, 250 * 350, requests=250,
                        turns_per_conversation={2: 50, 3: 50})
    plan = plan_budget([talk, *SIX[:2]], LENGTHS, PRICES, balance_usd=50, reserve_usd=0, round_to=1)
    d = plan.datasets[0]
    assert plan.targets["talk"] == 1_000_000 and d.limited_by_prompts and d.requests_available == 250
    assert plan.targets["B1"] == plan.targets["B2"] > 1_000_000
    assert plan.total_usd == pytest.approx(50, abs=1e-3)
    prop = plan_budget([talk, SIX[0]], LENGTHS, PRICES, balance_usd=1, policy="proportional", round_to=1).targets
    assert prop["B1"] == pytest.approx(80 * prop["talk"], rel=1e-6)  # 20,000 requests vs 250


def test_content_lengths_from_finished_records_else_a_share_of_the_output_guess(tmp_path):
    from eagledata.generation.plan.budget import ContentLengths

    path = tmp_path / "B1" / "records.jsonl"
    path.parent.mkdir()
    recs = [  # output ids: reasoning, </think>, content, <|im_end|> (ids from docs/FORMATS.md's example)
        {"finish_reason": "stop", "output_ids": [38, 7673, 13, 163607, 18699, 0, 163586], "usage": {}},  # 2
        {"finish_reason": "stop", "usage": {"completion_tokens": 10, "reasoning_tokens": 4}},  # 10 − 4 − 2 = 4
        {"finish_reason": "length", "output_ids": [38, 163607, 5, 5, 5], "usage": {"completion_tokens": 5}},  # cut
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    got = ContentLengths.from_records([path, tmp_path / "missing.jsonl"])
    assert (got.mean, got.sd) == (3.0, 1.0) and "2 finished answers" in got.source
    assert ContentLengths.from_records([tmp_path / "none.jsonl"]) is None
    prior = ContentLengths.prior(LENGTHS, 0.25)
    assert (prior.mean, prior.sd) == (1000.0, 750.0)
    with pytest.raises(InputError, match="field 'prior_content_share'"):
        ContentLengths.prior(LENGTHS, 1.5)


def test_budget_settings_plan_every_turn_by_default():
    from eagledata.generation import BudgetConfig

    cfg = BudgetConfig()
    assert (cfg.turns, cfg.prior_content_share) == ("all", 0.25)
    with pytest.raises(InputError, match="field 'turns'"):
        BudgetConfig(turns="first")
    with pytest.raises(InputError, match="field 'prior_content_share'"):
        BudgetConfig(prior_content_share=-0.1)


def test_a_prompt_limited_target_below_round_to_is_kept_not_rounded_to_zero(tmp_path):
    # issue 44 bug 3: two small datasets (5 and 3 prompts: at most 20k and 12k tokens) on $20 were each rounded down
    # to 0 with the default round_to of 100k, and the written file then refused every dataset.
    few = [DatasetStats("mychat", 5, 350, 200, 300, 700, 5 * 350), DatasetStats("mytools", 3, 350, 200, 300, 700, 1050)]
    plan = plan_budget(few, LENGTHS, PRICES, balance_usd=20, reserve_usd=2)
    assert plan.targets == {"mychat": 20_000, "mytools": 12_000}  # what their prompts can give, unrounded
    assert all(d.limited_by_prompts and d.total_usd > 0 for d in plan.datasets)
    big = plan_budget([*few, SIX[0]], LENGTHS, PRICES, balance_usd=20, reserve_usd=2)
    assert big.targets["B1"] % 100_000 == 0 and big.targets["mychat"] == 20_000  # above round_to: rounded down
    assert big.total_usd <= big.usable_usd
    one = plan_budget([SIX[0]], LENGTHS, PRICES, balance_usd=0.1, round_to=100_000)  # money for ~45k tokens
    assert 0 < one.targets["B1"] < 100_000 and one.total_usd <= one.usable_usd
    prompts = tmp_path / "a.jsonl"
    prompts.write_text('{"id": "1", "messages": [{"role": "user", "content": "q"}]}\n')
    path = tmp_path / "datasets.yaml"
    path.write_text("mychat:\n  prompts: a.jsonl\nmytools:\n  prompts: a.jsonl\n")
    write_targets(path, plan.targets, planned_usd=plan.planned_usd)
    assert {k: s.target_output_tokens for k, s in load_datasets(path).items()} == plan.targets  # generate's loader


def test_a_zero_target_is_refused_before_the_datasets_file_is_touched(tmp_path):
    path = tmp_path / "datasets.yaml"
    text = "A:\n  prompts: a.jsonl\n  target_output_tokens: 5\nB:\n  prompts: a.jsonl\n"
    path.write_text(text)
    with pytest.raises(InputError, match=r"datasets\.yaml field 'B\.target_output_tokens': the plan gives B 0"):
        write_targets(path, {"A": 7_000, "B": 0})
    assert path.read_text() == text


def test_the_plans_total_row_keeps_counts_whole():
    """The TOTAL row came out as floats ("92.00" prompts under the notebook's float format)."""
    frame = plan_budget(SIX, LENGTHS, PRICES, balance_usd=100, reserve_usd=5, round_to=1_000_000).frame()
    total = frame.iloc[-1]
    assert total["name"] == "TOTAL" and str(total["prompts"]) == "120000" and str(total["requests"]) == "10500"
    assert all(str(frame[c].dtype) == "int64" for c in ("prompts", "requests_available", "target_output_tokens",
                                                        "requests"))


def test_content_lengths_of_a_target_without_reasoning_use_its_end_of_turn():
    """SmolLM2's records (content then `<|im_end|>` id 2, no `</think>`): K2.5's ids would count the 2 as content."""
    from eagledata.generation.plan.budget import content_tokens
    from eagledata.text import Structure

    smol = Structure(end_of_turn=2)
    assert content_tokens({"finish_reason": "stop", "output_ids": [38, 7673, 13, 2]}, smol) == 3
    assert content_tokens({"finish_reason": "stop", "output_ids": [38, 7673, 13, 2]}) == 4  # read as K2.5's
    assert content_tokens({"finish_reason": "stop", "usage": {"completion_tokens": 10}}, smol) == 9
