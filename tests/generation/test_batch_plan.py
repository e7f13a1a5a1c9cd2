"""The batch route's pure parts: how much a round sends, the money check, the journal a rerun adopts from, and the
Batch API dialect of a line (issue 43)."""
import dataclasses
import json
import math
import random

import pytest

from eagledata.errors import InputError
from eagledata.generation import GenerateConfig
from eagledata.generation.batch.journal import BatchJournal, JournalLine
from eagledata.generation.batch.plan import MEASURED, REACH, Need, TurnLengths, fits, round_size
from eagledata.moonshot.batch_api import batch_body, batch_line, moonshot_message
from eagledata.moonshot.facts import BATCH_MODELS, FIXED_SAMPLING, batch_model, window_hours


# -- how much a round sends -------------------------------------------------------------------------------------------
def test_the_first_round_sends_the_estimate_share_on_the_guess_then_a_round_reaches_the_target():
    guess = TurnLengths(1000.0, 0.0)
    first = round_size(Need(100_000, 0), [], [1] * 500, guess, reach=False, first_share=0.9)
    assert (first.ready, first.new) == (0, 90)  # 90 one-turn prompts of 1,000 expected tokens: 0.9 of the target
    exact = TurnLengths(1000.0, 0.0, measured=50)
    top_up = round_size(Need(100_000, 89_000), [], [1] * 500, exact, reach=True, first_share=0.9)
    assert top_up.new == 11 and top_up.expected == 100_000  # no spread: exactly the target


def test_a_reaching_round_reaches_the_target_nine_times_in_ten_where_aiming_at_the_mean_is_a_coin_toss():
    """Issue 53 item 8: a round the plan counts on must reach the target, not approach it: drawn from the measured
    distribution, the answers of the lines it sends reach the target ~90 % of the time."""
    rng = random.Random(53)
    draw = lambda: min(32768, round(rng.lognormvariate(math.log(2400), 0.6)))  # noqa: E731 (the demo's answers)
    measured = TurnLengths.of([draw() for _ in range(12)], TurnLengths(4500.0, 5500.0))
    need = Need(60_000, 25_000)
    size = round_size(need, [], [1] * 200, measured, reach=True, first_share=0.9)
    reached = sum(need.recorded + sum(draw() for _ in range(size.new)) >= need.target for _ in range(4000)) / 4000
    at_mean = math.ceil((need.target - need.recorded) / measured.mean)
    by_mean = sum(need.recorded + sum(draw() for _ in range(at_mean)) >= need.target for _ in range(4000)) / 4000
    assert reached >= REACH - 0.05 and by_mean < 0.7, (size.new, at_mean, reached, by_mean)
    # the measured mean's own error counts: fewer answers measured, more lines for the same certainty
    many = dataclasses.replace(measured, measured=1000)
    assert round_size(need, [], [1] * 200, many, reach=True, first_share=0.9).new < size.new


def test_conversations_count_their_turns_how_often_they_go_on_and_the_spread_of_both():
    lengths = TurnLengths(1000.0, 0.0, go_on=0.5, measured=20)
    mean, var, answers = lengths.conversation(3)
    assert (mean, answers) == (1750.0, 1.75)  # 1 + 0.5 + 0.25 turns expected
    assert var == pytest.approx((1 + 3 * 0.5 + 5 * 0.25 - 1.75 ** 2) * 1000.0 ** 2)  # how many are answered varies


def test_open_conversations_go_first_and_those_the_target_does_not_need_wait():
    lengths = TurnLengths(1000.0, 0.0, measured=50)
    size = round_size(Need(10_000, 2_000), [3] * 10, [1] * 10, lengths, reach=True, first_share=0.9)
    assert (size.ready, size.new) == (3, 0)  # 2,000 + 3 x 3,000 >= 10,000: seven wait (dropped at the target)
    size = round_size(Need(10_000, 2_000), [1] * 2, [1] * 10, lengths, reach=True, first_share=0.9)
    assert (size.ready, size.new) == (2, 6)


def test_a_target_short_by_less_than_a_conversation_still_gets_one_and_a_met_target_none():
    guess = TurnLengths(50_000.0, 0.0)
    assert round_size(Need(100_000, 0), [], [1] * 10, guess, reach=False, first_share=0.9).new == 1
    measured = TurnLengths(5000.0, 0.0, measured=50)
    assert round_size(Need(100_000, 99_000), [], [1] * 10, measured, reach=True, first_share=0.9).new == 1
    assert round_size(Need(100_000, 100_000), [2], [1] * 10, measured, reach=True, first_share=0.9).new == 0
    assert round_size(Need(100_000, 99_000), [], [], measured, reach=True, first_share=0.9).new == 0  # none left


def test_turn_lengths_are_measured_once_there_are_enough_answers():
    guess = TurnLengths(3000.0, 2000.0)
    assert TurnLengths.of([100] * (MEASURED - 1), guess) == TurnLengths(3000.0, 2000.0, 1.0, 0)
    m = TurnLengths.of([100, 300] * 10, guess, went_on=15, ended=5)
    assert (m.mean, round(m.sd, 3), m.go_on, m.measured) == (200.0, round((20 * 100 ** 2 / 19) ** 0.5, 3),
                                                            16 / 21, 20)
    assert TurnLengths.of([], guess, went_on=0, ended=1).go_on == 0.5  # one ended conversation: not at once 0
    assert m.mean_error_var == pytest.approx(m.sd ** 2 / 20) and guess.mean_error_var == 0


def test_the_planned_rounds_are_the_budgets():
    """The batch route reports its rounds against the plan budget.ipynb makes (route_plan.BatchTiming)."""
    from eagledata.generation.plan.route_plan import BatchTiming, batch_rounds

    assert [batch_rounds(k) for k in (1, 2, 4)] == [2, 3, 5]
    assert BatchTiming(24, 2).rounds(4) == batch_rounds(4) == 5


def test_lines_fit_by_their_worst_cases_in_order():
    assert fits([1.0, 1.0, 1.0], 0.5, 2.5) == 2
    assert fits([3.0, 0.1], 0.0, 2.0) == 0  # in order: a cheaper line behind does not jump the queue
    assert fits([], 0.0, 1.0) == 0


# -- the journal ------------------------------------------------------------------------------------------------------
def line(cid: str, tries: int = 1) -> JournalLine:
    return JournalLine(cid, cid.split("#")[0], 1 if "#" not in cid else int(cid.split("#")[1]), tries, 0.25, 100, "s")


def test_the_journal_reads_back_every_step_and_drops_a_torn_last_event(tmp_path):
    path = tmp_path / "batches.jsonl"
    j = BatchJournal(path)
    j.prepared("b1", 1, [line("a"), line("b")], at=1.0)
    j.uploaded("b1", "file-1")
    j.created("b1", "batch_1")
    j.settled("b1", {"a": "recorded", "b": "retry"}, 0.01, "completed")
    j.prepared("b2", 2, [line("b", tries=2), line("a#2")], at=2.0)
    j.uploaded("b2", "file-2")
    with path.open("ab") as f:
        f.write(b'{"event": "created", "name": "b2", "batch_')  # killed mid-write
    again = BatchJournal(path)
    assert [e.name for e in again.pending] == ["b2"] and again.entries["b2"].file_id == "file-2"
    assert again.entries["b2"].batch_id is None  # the torn event did not happen, as far as a rerun knows
    assert again.entries["b1"].settled and again.entries["b1"].outcomes == {"a": "recorded", "b": "retry"}
    assert again.rounds == 2 and again.attempts("b") == 1 and again.tries("b") == 2 and again.attempts("a") == 0
    assert path.read_bytes().endswith(b"\n")  # truncated to the last whole event
    assert again.entries["b2"].bound_usd == 0.5


def test_the_plan_of_rounds_is_journaled_with_the_first_batch_and_kept_by_a_rerun(tmp_path):
    path = tmp_path / "batches.jsonl"
    j = BatchJournal(path)
    assert j.planned_rounds is None
    j.prepared("b1", 1, [line("a")], at=1.0, planned_rounds=3)
    j.prepared("b2", 2, [line("b")], at=2.0)
    assert BatchJournal(path).planned_rounds == 3 and BatchJournal(path).rounds == 2


def test_an_edited_journal_is_refused_naming_its_line(tmp_path):
    path = tmp_path / "batches.jsonl"
    path.write_text(json.dumps({"event": "uploaded", "name": "nobody", "file_id": "f"}) + "\n")
    with pytest.raises(InputError, match="line 1 is not a batch journal event") as e:
        BatchJournal(path)
    assert "batches.jsonl" in str(e.value)


# -- the dialect ------------------------------------------------------------------------------------------------------
def test_a_line_never_sets_sampling_and_sends_a_tool_loops_reasoning_as_reasoning_content():
    loop = {"role": "assistant", "content": "", "reasoning": "think", "tool_calls": [{"id": "functions.f:0"}],
            "reasoning_details": [{"type": "reasoning.text", "text": "think"}]}
    body = batch_body("kimi-k2.5", [{"role": "user", "content": "q"}, loop], max_tokens=100,
                      tools=[{"type": "function"}], parallel_tool_calls=True)
    assert not set(FIXED_SAMPLING) & set(body) and body["thinking"] == {"type": "enabled"}
    assert body["messages"][1] == {"role": "assistant", "content": "", "reasoning_content": "think",
                                   "tool_calls": [{"id": "functions.f:0"}]}
    assert moonshot_message(body["messages"][1]) == body["messages"][1]  # idempotent: a retry's body is the same
    assert batch_line("c#2", body) == {"custom_id": "c#2", "method": "POST", "url": "/v1/chat/completions",
                                       "body": body}


def test_batch_prices_windows_and_models():
    k25 = BATCH_MODELS["kimi-k2.5"]
    assert (k25.prompt_per_m, k25.completion_per_m) == (0.36, 1.8)
    assert k25.cost(1_000_000, 1_000_000) == pytest.approx(2.16)
    assert [window_hours(w) for w in ("12h", "24h", "3d", "7d")] == [12, 24, 72, 168]
    for bad in ("6h", "8d", "24", "1w", ""):
        with pytest.raises(ValueError, match="window"):
            window_hours(bad)
    with pytest.raises(ValueError, match="not served by Moonshot's Batch API.*kimi-k2.5, kimi-k2.6"):
        batch_model("moonshotai/kimi-k2.5")


@pytest.mark.parametrize("field,value,message", [
    ("batch_model", "kimi-k2", "not served by Moonshot's Batch API"),
    ("batch_window", "2h", "outside the Batch API's windows"),
    ("batch_first_round", 0.0, "within"),
])
def test_bad_batch_settings_are_refused_naming_the_field(field, value, message):
    with pytest.raises(InputError, match=message) as e:
        GenerateConfig(dataset="x", **{field: value})
    assert e.value.field == field


def test_generates_contract_names_come_first_with_their_defaults():
    """DESIGN.md fixes these names (outside checks pass them with papermill -p); the batch route's last."""
    fields = list(GenerateConfig.__dataclass_fields__)
    assert fields[:20] == ["dataset", "datasets_file", "base_url", "api_key_env", "model", "tokenizer", "concurrency",
                           "max_tokens", "temperature", "target_output_tokens", "max_spend_usd", "reserve_usd",
                           "output_dir", "limit", "route", "batch_base_url", "batch_api_key_env", "batch_model",
                           "batch_window", "batch_poll_s"]
    cfg = GenerateConfig(dataset="x")
    assert (cfg.route, cfg.batch_base_url, cfg.batch_api_key_env, cfg.batch_model, cfg.batch_window,
            cfg.batch_poll_s) == ("realtime", "https://api.moonshot.ai/v1", "MOONSHOT_API_KEY", "kimi-k2.5", "24h", 60)


def test_the_batch_panel_shows_each_rounds_batch():
    from eagledata.generation.report.panel import BatchPanel

    shown = []
    panel = BatchPanel(show=shown.append)
    panel.update("C 1,200/9,000 tok", [])
    assert shown == [panel.widget] and "no batch submitted yet" in panel.widget.value
    panel.update("C 5,000/9,000 tok, round 2 in_progress", [
        {"dataset": "C", "round": 1, "batch_id": "batch_aa", "status": "completed", "lines": 90, "answered": 85,
         "failed": 5, "usd": 0.0123, "waited_s": 3600.0},
        {"dataset": "C", "round": 2, "batch_id": "batch_bb", "status": "in_progress", "lines": 12, "answered": 3,
         "failed": 0, "usd": 0.0, "waited_s": 60.0}])
    value = panel.widget.value
    assert "round 2 in_progress" in value and "batch_aa" in value and "batch_bb" in value and ">85<" in value


def test_a_tokenizer_directory_says_its_release_and_each_batch_model_names_its_own():
    from eagledata.moonshot.facts import tokenizer_release
    from eagledata.text.tokenizer import BUNDLED_DIR

    assert {m.name: m.release_slug for m in BATCH_MODELS.values()} == {"kimi-k2.5": "kimi-k2.5",
                                                                       "kimi-k2.6": "kimi-k2.6"}
    assert tokenizer_release(BUNDLED_DIR) == "kimi-k2.5"
    assert tokenizer_release("/h/hub/models--moonshotai--Kimi-K2.6/snapshots/0123abc") == "kimi-k2.6"
    assert tokenizer_release("/models/Kimi-K2.6/tokenizer") == "kimi-k2.6"
    assert tokenizer_release("/tmp/my-tokenizer") is None  # says none: the target model decides
