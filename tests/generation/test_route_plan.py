"""The time–money plan (route_plan.py): the same targets at the batch and the realtime price, batch rounds from the
conversations' turns, and the deadline's choice, in exact arithmetic."""
import pytest

from eagledata.errors import InputError
from eagledata.generation.config import BudgetConfig
from eagledata.generation.plan.budget import DatasetStats, OutputLengths, PriceBasis, Prices, plan_budget
from eagledata.generation.plan.route_plan import (
    BatchTiming,
    DatasetWork,
    Throughput,
    batch_prices,
    choose_route,
    dataset_work,
    plan_routes,
    price_split,
    realtime_throughput,
    route_commands,
)
from eagledata.notebooks import jsonable

LENGTHS = OutputLengths(mean=4000, sd=3000, p50=3000, p90=8000, source="test")
ROUTED = Prices(0.45, 2.20, "test")  # OpenRouter's cheapest eligible (DeepInfra in the test catalog)
REF = Throughput(21_000.0, "test")   # the reference run
DAY = BatchTiming(window_h=24, round_expected_h=2.0, topups=1)


def stats(name, turns):
    """1,000 conversations (requests at 500 prompt tokens each) shaped as `turns` says ({turns: conversations})."""
    requests = sum(k * n for k, n in turns.items())
    return DatasetStats(name, sum(turns.values()), 500, 100, 500, 600, requests * 500, requests=requests,
                        turns_per_conversation=turns)


def work(name, max_turns, tokens=7_000_000, realtime=15.79375, batch=12.915):
    return DatasetWork(name, tokens, tokens // 4000, max_turns, realtime, batch)


def test_the_same_target_costs_60_percent_of_the_first_party_price_in_batch():
    s = stats("A", {1: 2000})
    plan = plan_budget([s], LENGTHS, ROUTED, balance_usd=15.8, round_to=1_000_000)
    assert plan.targets == {"A": 7_000_000} and plan.datasets[0].requests == 1750
    batch = batch_prices("moonshotai/kimi-k2.5")
    assert (batch.prompt_per_m, batch.completion_per_m) == (0.36, 1.80)
    [w] = dataset_work(plan, [s], LENGTHS, batch)
    # realtime as the plan: 1,750 x 500 x $0.45/M + 7M x $2.20/M; batch: the same tokens at $0.36 / $1.80
    assert w.realtime_usd == pytest.approx(0.39375 + 15.4) == plan.total_usd
    assert w.batch_usd == pytest.approx(0.315 + 12.6)
    first_party = 1750 * 500 * 0.60 / 1e6 + 7 * 3.00  # Moonshot's realtime price
    assert w.batch_usd / first_party == pytest.approx(0.60)
    assert batch_prices("openai/gpt-oss-120b") is None  # no batch route for a model Moonshot does not serve


@pytest.mark.parametrize("turns,max_turns", [({1: 1000}, 1), ({1: 700, 2: 300}, 2), ({1: 10, 3: 990}, 3)])
def test_rounds_are_the_longest_conversations_turns_plus_the_top_ups(turns, max_turns):
    s = stats("A", turns)
    plan = plan_budget([s], LENGTHS, ROUTED, balance_usd=10, round_to=1)
    [w] = dataset_work(plan, [s], LENGTHS, batch_prices("moonshotai/kimi-k2.5"))
    assert w.max_turns == max_turns
    for topups in (0, 1, 2):
        p = price_split([w], {"A": "batch"}, REF, BatchTiming(24, 2.0, topups))
        assert p.batch_rounds == max_turns + topups
        assert (p.batch_worst_h, p.batch_expected_h) == (24 * (max_turns + topups), 2 * (max_turns + topups))
        assert p.realtime_h == 0 and p.usd == w.batch_usd


def test_realtime_time_is_the_tokens_over_the_reference_rate_scaled_to_concurrency():
    assert realtime_throughput(2000).output_tps == 21_000
    assert realtime_throughput(1000).output_tps == 10_500
    assert realtime_throughput(2000, endpoint_tps=40).output_tps == 21_000  # 80k: an upper bound, not used
    slow = realtime_throughput(2000, endpoint_tps=5)                        # 10k is below the reference
    assert slow.output_tps == 10_000 and "per request" in slow.source
    assert realtime_throughput(2000, measured_tps=30_000).output_tps == 30_000
    p = price_split([work("A", 1), work("B", 3)], {"A": "realtime", "B": "realtime"}, REF, DAY)
    assert p.realtime_h == pytest.approx(14_000_000 / 21_000 / 3600)  # one pool: the sum over one rate
    assert p.expected_h == p.worst_h == p.realtime_h and p.batch_rounds == 0 and p.usd == 2 * 15.79375


TWO = [work("A", 1), work("B", 3)]  # A: one-turn prompts (2 rounds with the top-up), B: three turns (4 rounds)


def test_no_deadline_takes_the_cheapest_and_the_mixed_row_is_the_cheapest_sooner_than_batch():
    c = choose_route(TWO, REF, DAY)
    assert [r.name for r in c.rows] == ["realtime", "batch", "mixed"]
    assert c.chosen.name == "batch" and c.chosen.usd == pytest.approx(2 * 12.915)
    assert (c.chosen.batch_rounds, c.chosen.worst_h, c.chosen.expected_h) == (4, 96, 8)
    mixed = c.rows[2]  # the deep dataset realtime: two days sooner in the worst case, for $2.88 more
    assert mixed.routes == {"A": "batch", "B": "realtime"} and mixed.worst_h == 48
    assert mixed.usd == pytest.approx(12.915 + 15.79375)
    assert c.verdict.startswith("no deadline: batch, $25.83, 82% of realtime's $31.59")


def test_a_deadline_picks_the_cheapest_plan_that_meets_it():
    assert choose_route(TWO, REF, DAY, deadline_h=200).chosen.name == "batch"
    mid = choose_route(TWO, REF, DAY, deadline_h=72)  # batch's 96 h worst case misses; A's 48 h meets
    assert mid.chosen.name == "mixed" and mid.chosen.routes == {"A": "batch", "B": "realtime"}
    assert "batch: A, 2 rounds; realtime: B" in mid.verdict
    assert [r.name for r in mid.rows if mid.meets(r)] == ["realtime", "mixed"]
    fast = choose_route(TWO, REF, DAY, deadline_h=24)
    assert fast.chosen.name == "realtime" and fast.verdict.startswith(
        "deadline 24.0 h (judged on the worst-case time): realtime, $31.59; expected 11 min")
    # the same deadline on the expected time: batch's 4 rounds x 2 h meet 10 h
    assert choose_route(TWO, REF, DAY, deadline_h=10, basis="expected").chosen.name == "batch"
    assert choose_route(TWO, REF, DAY, deadline_h=10, basis="worst").chosen.name == "realtime"


def test_no_plan_meets_the_deadline_says_so():
    c = choose_route(TWO, REF, DAY, deadline_h=0.1)  # realtime needs 14M / 21k tok/s = 11 min
    assert c.chosen is None and c.commands == []
    assert c.verdict.startswith("NO PLAN MEETS THE DEADLINE of 6 min (judged on the worst-case time): the fastest, "
                                "realtime, takes 11 min")
    assert not c.frame()["meets_deadline"].any() and not c.frame()["chosen"].any()


def test_the_mixed_split_and_its_commands():
    four = [work("A", 1), work("B", 1), work("C", 2), work("D", 3)]
    c = choose_route(four, REF, DAY, deadline_h=72)  # C (3 rounds) and D (4 rounds) miss 72 h in batch
    assert c.chosen.routes == {"A": "batch", "B": "batch", "C": "batch", "D": "realtime"}
    assert c.chosen.batch_rounds == 3 and c.chosen.worst_h == 72
    assert c.chosen.usd == pytest.approx(3 * 12.915 + 15.79375)
    cmds = route_commands(c.chosen, ["A", "B", "C", "D"], BudgetConfig())
    assert cmds == ["papermill notebooks/generate.ipynb outputs/generate-realtime.ipynb -p dataset D -p route realtime",
                    "papermill notebooks/generate.ipynb outputs/generate-batch.ipynb -y 'dataset: [A, B, C]' "
                    "-p route batch -p batch_window 24h"]
    everything = choose_route(four, REF, DAY).chosen
    assert route_commands(everything, ["A", "B", "C", "D"], BudgetConfig(datasets_file="my.yaml"))[0].endswith(
        "-p dataset all -p route batch -p batch_window 24h -p datasets_file my.yaml")


def test_a_dataset_without_a_target_is_left_out_and_no_batch_model_means_realtime_only():
    c = choose_route([work("A", 1), work("Z", 3, tokens=0)], REF, DAY)
    assert c.chosen.routes == {"A": "batch"} and [r.name for r in c.rows] == ["realtime", "batch"]
    only = choose_route(TWO, REF, DAY, batch=False)
    assert [r.name for r in only.rows] == ["realtime"] and only.chosen.name == "realtime"
    assert choose_route([work("Z", 1, tokens=0)], REF, DAY).verdict == "no dataset has a target: nothing to generate"


def test_plan_routes_from_the_notebooks_objects():
    from tests.helpers.catalogs import catalog, decision_for

    two = [stats("B3", {1: 2000}), stats("B4", {1: 500, 2: 500})]
    plan = plan_budget(two, LENGTHS, ROUTED, balance_usd=40, reserve_usd=5, round_to=1_000_000)
    basis = PriceBasis(ROUTED, decision_for(catalog()), None, "test")
    choice = plan_routes(plan, two, LENGTHS, basis, BudgetConfig(deadline_h=60))
    assert choice.throughput.output_tps == 21_000  # the catalog's 40 tok/s x 2,000 bounds it at 80k: not lower
    assert choice.chosen.routes == {"B3": "batch", "B4": "realtime"}  # B4's 3 rounds x 24 h miss 60 h
    assert choice.commands[1] == ("papermill notebooks/generate.ipynb outputs/generate-batch.ipynb -p dataset B3 "
                                  "-p route batch -p batch_window 24h")
    result = jsonable(choice.to_dict())
    assert result["chosen"]["name"] == "mixed" and result["chosen"]["worst_h"] == 48
    assert result["timing"] == {"window_h": 24, "round_expected_h": 2.0, "topups": 1}
    week = plan_routes(plan, two, LENGTHS, basis, BudgetConfig(batch_window="7d", batch_topups=0))
    assert week.chosen.name == "batch" and week.chosen.worst_h == 2 * 168


@pytest.mark.parametrize("field,value", [("batch_window", "6h"), ("batch_window", "1 day"), ("deadline_h", 0),
                                         ("batch_round_expected_h", 25), ("batch_round_expected_h", 0),
                                         ("batch_topups", -1), ("realtime_output_tps", 0.0),
                                         ("deadline_basis", "typical")])
def test_budget_settings_refuse_out_of_range_values_naming_the_field(field, value):
    with pytest.raises(InputError, match=f"field '{field}'"):
        BudgetConfig(**{field: value})


def test_durations_read_in_seconds_minutes_hours_or_days():
    from eagledata.generation.plan.route_plan import hours_text

    assert [hours_text(h) for h in (3 / 3600, 0.5, 30, 72)] == ["3 s", "30 min", "30.0 h", "3.0 d"]


def test_many_datasets_are_split_by_depth():
    """Past EXHAUSTIVE_MAX datasets the splits are by conversation depth: the shallow ones batch, the deep realtime."""
    many = [work(f"S{i}", 1) for i in range(12)] + [work("D", 3)]
    c = choose_route(many, REF, DAY, deadline_h=72)
    assert len(c.splits) == 3  # depth 0 (all realtime), 1, 3 (all batch)
    assert c.chosen.datasets("realtime") == ["D"] and c.chosen.worst_h == 48


def test_commands_of_an_emulator_study_and_of_targets_not_written():
    """Issue 53: after a budget run against the emulator the printed commands dropped `-p base_url emulator` but kept
    its output folder (as printed: a missing key, or with one a paid run writing into the emulator's folder); with
    `write: False` they assumed targets nobody wrote. Both now travel in the commands."""
    four = [work("A", 1), work("B", 1), work("C", 2), work("D", 3)]
    c = choose_route(four, REF, DAY, deadline_h=72)
    emu = BudgetConfig(base_url="emulator")
    cmds = route_commands(c.chosen, ["A", "B", "C", "D"], emu, {"A": 100, "B": 200, "C": 300, "D": 400})
    assert cmds == ["papermill notebooks/generate.ipynb outputs/generate-realtime.ipynb -p dataset D -p route realtime "
                    "-y 'target_output_tokens: {D: 400}' -p base_url emulator",
                    "papermill notebooks/generate.ipynb outputs/generate-batch.ipynb -y 'dataset: [A, B, C]' "
                    "-p route batch -p batch_window 24h -y 'target_output_tokens: {A: 100, B: 200, C: 300}' "
                    "-p base_url emulator"]
    from eagledata.generation import GenerateConfig

    assert GenerateConfig(base_url="emulator").output_dir == emu.output_dir  # the emulator's folder, by default
    run = GenerateConfig(dataset=["A", "B"], target_output_tokens={"A": 100, "B": 200})
    assert (run.target_for("A"), run.target_for("B"), run.target_for("Z")) == (100, 200, None)
    with pytest.raises(InputError, match="target_output_tokens.B"):
        GenerateConfig(target_output_tokens={"A": 100, "B": 0})


def test_realtime_time_is_its_answers_time_not_its_tokens_over_the_pools_rate():
    """Issue 53: 225 requests for 1M tokens were planned at 48 s (1M / 21k tok/s) and 5 requests at 1 s, worst case
    equal to expected. A realtime run's time is at least what its answers take: one wave waits for its longest, a
    full pool delivers at its slots' speed, a conversation's turns come one after another; the slow case at the slow
    endpoints' speed."""
    from eagledata.generation.plan.route_plan import AnswerTimes, realtime_seconds

    one = [1000] * 10  # every answer 1,000 tokens
    few = [DatasetWork("A", 5_000, 5, 1, 0.0, 0.0, available=5)]
    assert realtime_seconds(few, one, 2000, 100.0, 2.0) == pytest.approx(2.0 + 10.0)  # one wave: latency + 10 s
    pool = [DatasetWork("A", 100_000, 100, 1, 0.0, 0.0, available=100)]
    assert realtime_seconds(pool, one, 10, 100.0, 0.0) == pytest.approx(100.0)  # 10 waves of 10 s on 10 slots
    chained = [DatasetWork("A", 30_000, 30, 3, 0.0, 0.0, available=30, turns=((3, 10),))]
    assert realtime_seconds(chained, one, 2000, 100.0, 0.0) == pytest.approx(30.0)  # 3 turns, one after another
    spare = [DatasetWork("A", 5_000, 5, 1, 0.0, 0.0, available=50)]  # cut mode fills the pool: the target comes sooner
    assert realtime_seconds(spare, one, 2000, 100.0, 0.0) == pytest.approx(1.0)

    answers = AnswerTimes(100.0, 2.0, 50.0, 4.0, "test")
    rate = Throughput(21_000.0, "test", answers=answers, concurrency=2000, samples=tuple(one))
    expected_h, worst_h = rate.hours(few)
    assert expected_h * 3600 == pytest.approx(12.0) and worst_h * 3600 == pytest.approx(4.0 + 20.0)
    big = [DatasetWork("A", 42_000_000, 42_000, 1, 0.0, 0.0, available=42_000)]
    assert rate.hours(big)[0] == pytest.approx(2000 / 3600)  # a big job: its tokens over the pool's rate, as before
    plan = price_split(few, {"A": "realtime"}, rate, DAY)
    assert plan.expected_h * 3600 == pytest.approx(12.0) and plan.worst_h * 3600 == pytest.approx(24.0)
