"""The experiment runner's stages that need no speculators (quality/experiment.py), on a tiny target: the prompts
both arms share, both arms' records, equal supervised tokens, the speculators export with token_freq.pt, and resume
(a finished stage is kept, its model never loaded again). Training and τ run in `make test-interop`
(test_quality_interop.py)."""
from __future__ import annotations

import json
import sys

import pytest
import torch

from eagledata.errors import InputError
from eagledata.quality.arms import ARMS
from eagledata.quality.commands import run_logged
from eagledata.quality.experiment import Experiment, ExperimentSeams
from eagledata.quality.stages import share_data
from eagledata.quality.trainer import train_args
from tests.helpers.quality_experiment import tiny_config


def no_commands(cmd, env, log_file, label):
    raise AssertionError(f"no command expected here: {label}")


def test_the_stages_before_training_and_their_resume(tmp_path):
    config = tiny_config(tmp_path)
    said = []
    exp = Experiment(config, ExperimentSeams(run=no_commands, say=said.append))
    asks = exp.prompts()
    assert len(asks) == 8 and [a.id for a in asks] == [f"conv{i:03d}" for i in range(8)]
    prompts_stage = json.loads(exp.files.stage("prompts").read_text())
    assert prompts_stage["passed_over"] == {"no data-set answer to its first ask": 1}
    for arm in ARMS:
        exp.arm_records(arm, asks)
    off = [json.loads(line) for line in exp.files.records("off_policy").read_text().splitlines()]
    on = [json.loads(line) for line in exp.files.records("on_policy").read_text().splitlines()]
    assert len(off) == 16 and {r["conversation_id"] for r in on} == {a.id for a in asks}
    assert all(r["meta"]["sampling"]["greedy"] for r in on)
    assembled = exp.assemble_arms()
    rows = {row["arm"]: row for row in assembled["table"]}
    assert rows["on_policy"]["supervised_tokens"] == rows["off_policy"]["supervised_tokens"] \
        == assembled["supervised_tokens"] > 0
    for arm in ARMS:
        exp.extract_arm(arm)
        export = exp.files.export(arm)
        freq = torch.load(export / "token_freq.pt", weights_only=True)
        assert sum(freq.values()) == assembled["supervised_tokens"]
        assert json.loads((export / "manifest.json").read_text())["layout"] == "speculators"
    kept = {p: p.stat().st_mtime_ns for p in exp.files.root.rglob("*") if p.is_file()}

    def never(path):
        raise AssertionError("a finished stage loaded the model again")

    again = Experiment(config, ExperimentSeams(load_model=never, load_chat=never, run=no_commands, say=said.append))
    assert [a.id for a in again.prompts()] == [a.id for a in asks]
    for arm in ARMS:
        again.arm_records(arm, asks)
    assert again.assemble_arms() == json.loads(exp.files.stage("assemble").read_text())
    for arm in ARMS:
        again.extract_arm(arm)
    assert {p: p.stat().st_mtime_ns for p in exp.files.root.rglob("*") if p.is_file()} == kept
    assert sum("done before: kept" in line for line in said) == 6


def test_both_arms_train_with_the_same_flags_but_their_data(tmp_path):
    config = tiny_config(tmp_path)
    a = train_args(config, tmp_path / "t", tmp_path / "on", tmp_path / "o1")
    b = train_args(config, tmp_path / "t", tmp_path / "off", tmp_path / "o2")
    differ = [(x, y) for x, y in zip(a, b) if x != y]
    assert len(a) == len(b) and len(differ) == 3 and "--seed" in a


def test_a_failed_command_names_its_log_and_last_lines(tmp_path):
    log = tmp_path / "x.log"
    with pytest.raises(RuntimeError, match=r"(?s)train on_policy failed \(exit 3\).*x\.log.*the last words"):
        run_logged([sys.executable, "-c", "print('the last words'); raise SystemExit(3)"], {}, log,
                   "train on_policy", say=lambda s: None)


def test_the_prompt_row_asks_exactly_the_chosen_turns():
    """generate.ipynb drops the data set's answers and asks after each user turn: the row holds the chosen asks
    with the data set's answers between them, so that it asks exactly those turns (the off-policy arm's)."""
    from eagledata.generation.conversations.turns import split_asks
    from eagledata.prompts import normalize_prompt
    from eagledata.quality.arms import Asks, conversation_asks
    from eagledata.quality.regenerate import prompt_row

    messages = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "a1"},
                {"role": "user", "content": "two"}, {"role": "assistant", "content": "a2"},
                {"role": "user", "content": "three"}, {"role": "assistant", "content": "a3"}]
    asks = conversation_asks("c", messages, max_turns=2)
    assert isinstance(asks, Asks)
    row = prompt_row(asks)
    assert row["messages"] == messages[:3]
    split = split_asks(normalize_prompt(row).messages)
    assert split is not None and split[0] == asks.asks


def test_a_kept_stage_made_with_other_settings_is_refused(tmp_path):
    """Resume keeps a finished stage; a rerun with settings that stage depends on changed must not pass its outputs
    off as the new ones."""
    from eagledata.errors import InputError

    config = tiny_config(tmp_path)
    Experiment(config, ExperimentSeams(run=no_commands, say=lambda s: None)).prompts()
    wider = tiny_config(tmp_path, conversations=9)
    with pytest.raises(InputError, match=r"stage prompts was made with other settings \(conversations 8 there, 9"):
        Experiment(wider, ExperimentSeams(run=no_commands, say=lambda s: None)).prompts()
    later = tiny_config(tmp_path, questions=1)  # a later stage's setting: the prompts are kept
    assert len(Experiment(later, ExperimentSeams(run=no_commands, say=lambda s: None)).prompts()) == 8


def test_settings_that_cannot_work_are_refused_by_field():
    from eagledata.errors import InputError
    from eagledata.quality.config import QualityConfig

    with pytest.raises(InputError, match="must be 1 or more, got 0") as bad:
        QualityConfig(epochs=0)
    assert bad.value.field == "epochs"
    with pytest.raises(InputError, match="shorter than sample_tokens 1024") as bad:
        QualityConfig(total_seq_len=512)
    assert bad.value.field == "total_seq_len"
    assert QualityConfig(total_seq_len=512, sample_tokens=512).total_seq_len == 512


def test_another_seed_trains_on_an_experiments_data_linked_not_made_again(tmp_path):
    """`data_from`: the same prompts, records, samples and hidden states (hard links, not copies), so that a second
    seed costs training and τ only; the trainer's and τ's stages stay this experiment's own."""
    first = Experiment(tiny_config(tmp_path), ExperimentSeams(run=no_commands, say=lambda s: None))
    asks = first.prompts()
    for arm in ARMS:
        first.arm_records(arm, asks)
    first.assemble_arms()
    for arm in ARMS:
        first.extract_arm(arm)
    (first.files.stage("train/on_policy")).write_text("{}")  # a trainer's stage of the first: never linked

    def never(path):
        raise AssertionError("the data was made again")

    seeded = tiny_config(tmp_path, experiment="tiny-seed1", seed=1, data_from="tiny")
    said: list[str] = []
    share_data(seeded, said.append)
    assert [line for line in said if "linked from" in line] == [
        f"[{name}] linked from {first.files.root}" for name in ("target", "prompts", "records/on_policy",
                                                                "records/off_policy", "assemble",
                                                                "extract/on_policy", "extract/off_policy")]
    again = Experiment(seeded, ExperimentSeams(load_model=never, load_chat=never, run=no_commands, say=said.append))
    assert [a.id for a in again.prompts()] == [a.id for a in asks]
    for arm in ARMS:
        again.arm_records(arm, asks)
        again.extract_arm(arm)
        freq = "hidden_states/speculators/token_freq.pt"
        assert (again.files.arm(arm) / freq).stat().st_ino == (first.files.arm(arm) / freq).stat().st_ino
        assert again.samples(arm) == first.samples(arm)
    assert again.assemble_arms() == json.loads(first.files.stage("assemble").read_text())
    assert not again.files.stage("train/on_policy").exists()
    said.clear()
    share_data(seeded, said.append)  # a rerun keeps what it has
    assert said == []
    again.files.stage("extract/on_policy").unlink()  # a try stopped after linking the files, before the stage's
    share_data(seeded, said.append)
    assert said == [f"[extract/on_policy] linked from {first.files.root}"]
    assert (again.files.arm("on_policy") / freq).stat().st_ino == (first.files.arm("on_policy") / freq).stat().st_ino
    # data made with other settings, or not made yet: refused before anything is linked
    wider = tiny_config(tmp_path, experiment="tiny-wider", data_from="tiny", conversations=9)
    with pytest.raises(InputError, match=r"data_from 'tiny' made its stage prompts with other settings "
                                         r"\(conversations 8 there, 9 now\)"):
        share_data(wider, said.append)
    assert not Experiment(wider).files.root.exists()
    with pytest.raises(InputError, match="experiment 'nope' has not finished its stage target"):
        share_data(tiny_config(tmp_path, experiment="x", data_from="nope"), said.append)
    with pytest.raises(InputError, match="data_from.*is this experiment itself"):
        tiny_config(tmp_path, data_from="tiny")
