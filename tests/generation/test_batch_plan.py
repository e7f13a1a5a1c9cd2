"""The batch route's pure parts: how much a round sends, the money check, the journal a rerun adopts from, and the
Batch API dialect of a line (issue 43)."""
import json

import pytest

from eagledata.errors import InputError
from eagledata.generation import GenerateConfig
from eagledata.generation.batch.journal import BatchJournal, JournalLine
from eagledata.generation.batch.plan import OVER_LIMIT, TOP_UP_AIM, Need, TurnLengths, fits, new_conversations
from eagledata.moonshot.batch_api import batch_body, batch_line, moonshot_message
from eagledata.moonshot.facts import BATCH_MODELS, FIXED_SAMPLING, batch_model, window_hours


# -- how much a round sends -------------------------------------------------------------------------------------------
def test_the_first_round_sends_the_estimate_less_its_margin_then_top_ups_aim_just_over():
    guess = TurnLengths(1000.0, 0.0)
    first = new_conversations(Need(100_000, 0), [1] * 500, guess, first=True, first_share=0.9)
    assert first == 90  # 90 one-turn prompts of 1,000 expected tokens: 0.9 of the target
    measured = TurnLengths(1000.0, 0.0, measured=True)
    top_up = new_conversations(Need(100_000, 89_000), [1] * 500, measured, first=False, first_share=0.9)
    assert top_up == int((TOP_UP_AIM * 100_000 - 89_000) // 1000)  # 12: 101,000 expected
    # a guess proven by measurement aims at the target even in a dataset's first round (an earlier run measured)
    assert new_conversations(Need(100_000, 0), [1] * 500, measured, first=True, first_share=0.9) == 101


def test_conversations_count_their_turns_and_how_often_they_go_on():
    lengths = TurnLengths(1000.0, 0.0, go_on=0.5, measured=True)
    assert lengths.conversation(3) == (1000.0 * 1.75, 0.0)  # 1 + 0.5 + 0.25 turns expected
    # open conversations' expected tokens count against the target before any new one starts
    need = Need(10_000, 2_000, open_mean=7_000)
    assert new_conversations(need, [3] * 10, lengths, first=False, first_share=0.9) == 0  # 9,000 + 1,750 > 10,150


def test_a_target_short_by_less_than_a_conversation_still_gets_one_and_a_met_target_none():
    measured = TurnLengths(5000.0, 0.0, measured=True)
    assert new_conversations(Need(100_000, 99_000), [1] * 10, measured, first=False, first_share=0.9) == 1
    assert new_conversations(Need(100_000, 100_000), [1] * 10, measured, first=False, first_share=0.9) == 0
    assert new_conversations(Need(100_000, 99_000), [], measured, first=False, first_share=0.9) == 0  # none left


def test_the_spread_bounds_a_round_when_answers_vary():
    wide = TurnLengths(1000.0, 3000.0, measured=True)  # sd 3x the mean: a few prompts can overshoot a small target
    n = new_conversations(Need(20_000, 0), [1] * 100, wide, first=False, first_share=0.9)
    mean, var = 1000.0 * n, 3000.0 ** 2 * n
    assert mean + 2 * var ** 0.5 <= 20_000 * OVER_LIMIT
    assert n < 20  # the expected total alone would have allowed 20


def test_turn_lengths_are_measured_once_there_are_enough_answers():
    guess = TurnLengths(3000.0, 2000.0)
    assert TurnLengths.of([100] * 19, guess) == TurnLengths(3000.0, 2000.0, 1.0, False)
    m = TurnLengths.of([100, 300] * 10, guess, went_on=15, ended=5)
    assert (m.mean, round(m.sd, 3), m.go_on, m.measured) == (200.0, round((20 * 100 ** 2 / 19) ** 0.5, 3),
                                                            0.75, True)


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
