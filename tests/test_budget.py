import json

import pytest
from hypothesis import given, settings, strategies as st

from eagledata.generation.budget import (DatasetStats, OutputLengths, Prices, cost_band, plan_budget, planned_vs_actual,
                              scenario_table)
from eagledata.generation.datasets import load_datasets, write_targets
from eagledata.errors import InputError

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
    from test_providers import catalog, decision_for

    from eagledata.aio import run_sync
    from eagledata.generation import BudgetConfig, plan_prices

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
