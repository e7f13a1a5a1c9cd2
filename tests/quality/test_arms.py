"""The two arms' policy (quality/arms.py): off-policy records supervise the data set's answers and nothing else,
on-policy records carry the target's own history, and `equalize` leaves both arms at exactly the same supervised
tokens over the same turns."""
from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from eagledata.errors import InputError
from eagledata.quality.arms import (
    Asks,
    Equalized,
    TextStageChat,
    conversation_asks,
    equalize,
    off_policy_records,
    regenerate_greedy,
    supervised,
    take_supervised,
    trim_to,
)
from eagledata.text import prompt_ids
from eagledata.training.assembly import AssemblyPolicy, Sample, assemble

CONVERSATION = [
    {"role": "assistant", "content": "Welcome! (a leading assistant message: context only)"},
    {"role": "user", "content": "USERONE what is a prime number?"},
    {"role": "assistant", "content": "A prime has exactly two divisors."},
    {"role": "assistant", "content": "A second answer in a row: the data set's, dropped."},
    {"role": "user", "content": "USERTWO and is 1 prime?"},
    {"role": "assistant", "content": "No: 1 has one divisor."},
    {"role": "user", "content": "USERTHREE thanks"},  # the data set never answered it
]


@pytest.fixture(scope="module")
def chat(tok):
    return TextStageChat(tok)


def test_off_policy_records_supervise_exactly_the_data_sets_answers(chat, tok):
    asks = conversation_asks("c1", CONVERSATION, max_turns=5)
    assert not isinstance(asks, str)
    assert asks.answers == ["A prime has exactly two divisors.", "No: 1 has one divisor.", None]
    made = off_policy_records([asks], chat)
    assert [(r.id, r.turn, r.conversation_id) for r in made.records] == [("c1", 1, "c1"), ("c1#2", 2, "c1")]
    assert made.dropped == {"no answer in the data set": 1}
    first, second = made.records
    # the prompt is the text stage's own rendering (generation prompt included), the answer the recipe's ids
    assert first.prompt_ids == prompt_ids(tok, CONVERSATION[:2])
    assert second.messages == [*CONVERSATION[:3], CONVERSATION[4]]  # the data set's first answer as history
    for r in made.records:
        assert r.output_ids == chat.answer_ids(r.content) and r.finish_reason == "stop"
        taught = tok.decode([t for t, m in zip(r.input_ids, r.loss_mask) if m])
        assert r.content in taught and "USER" not in taught and "Welcome" not in taught
        assert sum(r.loss_mask) == len(r.output_ids)


def test_an_answer_longer_than_max_tokens_is_cut_as_an_on_policy_answer_is(chat):
    asks = Asks("c", [[{"role": "user", "content": "say a lot"}]], ["word " * 200])
    (r,) = off_policy_records([asks], chat, max_tokens=16).records
    assert len(r.output_ids) == 16 and r.finish_reason == "length"
    assert r.output_ids == chat.answer_ids(asks.answers[0])[:16]


def test_a_cut_data_set_answer_ends_its_conversation_as_a_cut_on_policy_answer_does(chat):
    """Issue 59 item 2: an off-policy turn 2 would carry the data set's whole first answer as history while its
    turn-1 sample was cut; now the cut ends the conversation in both arms, counted. Planted: history carried on."""
    asks = Asks("c", [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}],
                      [{"role": "user", "content": "c"}]], ["word " * 200, "fine", "ok"])
    made = off_policy_records([asks], chat, max_tokens=16)
    assert [(r.turn, r.finish_reason) for r in made.records] == [(1, "length")]
    assert made.dropped == {"later turns after a cut answer": 2}
    whole = off_policy_records([asks], chat)  # uncapped: nothing cut, every turn asked
    assert [r.turn for r in whole.records] == [1, 2, 3] and not whole.dropped


def test_the_arms_table_shows_what_each_arm_trains_on_by_turn_and_its_cut_answers():
    arm = [sample("a", 1, 2, 3), sample("a", 2, 2, 3), sample("b", 1, 2, 3)]
    arm[0] = replace(arm[0], truncated=True)
    (row,) = Equalized({"x": arm}, 9, 3, {"x": {}}).table()
    assert row["turn_samples"] == {"1": 2, "2": 1} and row["turn_shares"] == {"1": 0.6667, "2": 0.3333}
    assert row["cut_answers"] == 1 and row["cut_answer_share"] == 0.3333


def test_an_empty_data_set_answer_ends_its_conversation(chat):
    asks = Asks("c", [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]], ["  ", "fine"])
    made = off_policy_records([asks], chat)
    assert made.records == [] and made.dropped == {"empty answer": 1}


def test_on_policy_turns_carry_the_targets_own_answers(chat, tok):
    asks = [Asks("a", [[{"role": "user", "content": "one"}], [{"role": "user", "content": "two"}]], ["x", "y"]),
            Asks("b", [[{"role": "user", "content": "three"}], [{"role": "user", "content": "four"}]], ["x", "y"])]
    seen = []

    def generate(prompts, max_new_tokens):
        seen.append(len(prompts))
        out = []
        for p in prompts:
            if tok.decode(p).endswith("three<|im_end|><|im_assistant|>assistant<|im_middle|><think>"):
                out.append(tok.encode_ordinary(" never ends" * 20)[:max_new_tokens])  # cut at max_tokens
            else:
                out.append(chat.answer_ids(f"answer {len(p)}"))
        return out

    progress = []
    made = regenerate_greedy(asks, chat, generate, max_tokens=8, batch_size=1,
                             progress=lambda d, t: progress.append((d, t)))
    assert [(r.id, r.finish_reason) for r in made.records] == [("a", "stop"), ("b", "length"), ("a#2", "stop")]
    a2 = made.records[2]
    assert a2.messages[1] == {"role": "assistant", "content": made.records[0].content}  # its own answer, as text
    assert a2.messages[1]["content"].startswith("answer ")
    assert a2.prompt_ids == chat.prompt_ids(a2.messages) and a2.meta["sampling"]["greedy"]
    assert made.dropped == {"later turns after a cut or empty answer": 1}
    assert progress == [(1, 4), (2, 4), (3, 4)] and seen == [1, 1, 1]


def sample(cid, turn, prompt, answer):
    return Sample(id=cid if turn == 1 else f"{cid}#{turn}", dataset="d", input_ids=list(range(prompt + answer)),
                  loss_mask=[0] * prompt + [1] * answer, truncated=False, conversation_id=cid, turn=turn)


def test_equalize_gives_both_arms_the_same_supervised_tokens_over_the_same_turns():
    rng = random.Random(0)
    on = [sample(f"c{i:02d}", t, rng.randint(3, 9), rng.randint(1, 30)) for i in range(20) for t in (1, 2)]
    off = [sample(f"c{i:02d}", t, rng.randint(3, 9), rng.randint(20, 60)) for i in range(20) for t in (1, 2)]
    on.append(sample("only-on", 1, 4, 50))  # a turn the other arm lacks: left out of both
    rng.shuffle(off)
    eq = equalize({"on_policy": on, "off_policy": off})
    smaller = supervised(s for s in on if s.conversation_id != "only-on")
    assert eq.supervised_tokens == smaller
    assert supervised(eq.arms["on_policy"]) == supervised(eq.arms["off_policy"]) == smaller
    assert len(eq.arms["on_policy"]) == 40 and eq.left_out["on_policy"]["not_in_other_arm"] == 1
    kept = eq.arms["off_policy"]
    keys = [(s.conversation_id, s.turn) for s in kept]
    assert keys == sorted(keys) and keys == sorted((s.conversation_id, s.turn) for s in off)[:len(kept)]
    last = kept[-1]
    assert [s.shortened for s in kept] == [False] * (len(kept) - 1) + [True]
    assert last.loss_mask[-1] == 1 and last.input_ids == list(range(len(last)))  # trimmed inside its answer
    assert eq.left_out["off_policy"]["over_equal_tokens"] == 40 - len(kept)


def test_a_sample_that_ends_on_the_line_is_kept_whole():
    arm = [sample("a", 1, 2, 5), sample("b", 1, 2, 5), sample("c", 1, 2, 5)]
    assert [s.shortened for s in take_supervised(arm, 10)] == [False, False]
    assert supervised(take_supervised(arm, 11)) == 11 and take_supervised(arm, 11)[-1].input_ids == [0, 1, 2]
    with pytest.raises(ValueError, match="fewer than 9"):
        trim_to(arm[0], 9)


def test_arms_sharing_no_turn_are_refused():
    with pytest.raises(InputError, match="share no supervised token"):
        equalize({"on_policy": [sample("a", 1, 2, 5)], "off_policy": [sample("b", 1, 2, 5)]})


def test_both_arms_through_assembly_reach_equal_supervised_tokens(chat, tmp_path):
    """Records of both arms as files, assembled as any dataset's are, then equalized."""
    conversations = [Asks(f"c{i}", [[{"role": "user", "content": f"question {i}"}],
                                    [{"role": "user", "content": f"more on {i}"}]],
                          [f"long answer {i} " * (5 + i), f"second {i}"]) for i in range(6)]
    off = off_policy_records(conversations, chat, dataset="off_policy", max_tokens=40)

    def generate(prompts, max_new_tokens):
        return [chat.answer_ids(f"mine {len(p)}") for p in prompts]

    on = regenerate_greedy(conversations, chat, generate, dataset="on_policy", max_tokens=40)
    samples = {}
    for arm, made in (("on_policy", on), ("off_policy", off)):
        path = tmp_path / arm / "records.jsonl"
        path.parent.mkdir()
        path.write_text("".join(json.dumps(json.loads(r.to_json())) + "\n" for r in made.records))
        samples[arm] = assemble([path], policy=AssemblyPolicy(max_length=512)).samples
    eq = equalize(samples)
    assert supervised(eq.arms["on_policy"]) == supervised(eq.arms["off_policy"]) == eq.supervised_tokens > 0
    assert {(s.conversation_id, s.turn) for s in eq.arms["off_policy"]} <= {
        (s.conversation_id, s.turn) for s in samples["on_policy"]}
