"""The experiment runner's stages that need no speculators (quality/arm_data.py, as experiment.py composes them), on
a tiny target: the prompts both arms share, both arms' records, equal supervised tokens, the speculators export with
token_freq.pt, and resume (a finished stage is kept, its model never loaded again). Training and τ run in
`make test-interop` (test_quality_interop.py)."""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from eagledata.errors import InputError
from eagledata.quality.arm_data import ArmData
from eagledata.quality.arms import ARMS, supervised
from eagledata.quality.commands import run_logged, stop_commands
from eagledata.quality.config import QualityConfig
from eagledata.quality.experiment import Experiment, ExperimentSeams
from eagledata.quality.stages import share_data, stage_settings
from eagledata.quality.trainer import (
    EPOCH_FILES,
    Resume,
    epoch_losses,
    read_metrics,
    resume_point,
    split_ratio,
    train_args,
)
from eagledata.quality.workspace import Workspace
from eagledata.training.assembly import Sample
from tests.helpers.quality_experiment import make_data, tiny_config


def no_commands(cmd, env, log_file, label):
    raise AssertionError(f"no command expected here: {label}")


def test_the_stages_before_training_and_their_resume(tmp_path):
    config = tiny_config(tmp_path)
    said = []
    exp = Experiment(config, ExperimentSeams(run=no_commands, say=said.append))
    asks = exp.arm_data.prompts()
    ids = [a.id for a in asks]  # drawn by data_seed 0 from the 12 usable conversations (and one without an answer)
    assert len(set(ids)) == 11 and set(ids) <= {f"conv{i:03d}" for i in range(12)} and ids != sorted(ids)
    assert exp.arm_data.validation_ids() == set(ids[8:])  # the held-out ones: the next three of the same draw
    prompts_stage = json.loads(exp.files.stage("prompts").read_text())
    assert prompts_stage["passed_over"] in ({}, {"no data-set answer to its first ask": 1})
    for arm in ARMS:
        exp.arm_data.arm_records(arm, asks)
    off = [json.loads(line) for line in exp.files.records("off_policy").read_text().splitlines()]
    on = [json.loads(line) for line in exp.files.records("on_policy").read_text().splitlines()]
    off_stage = json.loads(exp.files.stage("records/off_policy").read_text())
    # 22 asks; a data-set answer cut at answer_tokens ends its conversation (issue 59 item 2): its turn 2 not asked
    assert off_stage["dropped"] == {"later turns after a cut answer": 1}, off_stage
    assert len(off) == 21 and {r["conversation_id"] for r in on} == {a.id for a in asks}
    assert all(r["turn"] == 1 for r in off if r["finish_reason"] == "length")
    assert all(r["meta"]["sampling"]["greedy"] for r in on)
    assembled = exp.arm_data.assemble_arms()
    rows = {row["arm"]: row for row in assembled["table"]}
    assert rows["on_policy"]["supervised_tokens"] == rows["off_policy"]["supervised_tokens"] \
        == assembled["supervised_tokens"] > 0
    for arm in ARMS:
        exp.arm_data.extract_arm(arm)
        export = exp.files.export(arm)
        freq = torch.load(export / "token_freq.pt", weights_only=True)
        assert sum(freq.values()) == supervised(exp.arm_data.samples(arm))  # the extraction's own count, all samples
        assert json.loads((export / "manifest.json").read_text())["layout"] == "speculators"
    kept = {p: p.stat().st_mtime_ns for p in exp.files.root.rglob("*") if p.is_file()}

    def never(path):
        raise AssertionError("a finished stage loaded the model again")

    again = Experiment(config, ExperimentSeams(load_model=never, load_chat=never, run=no_commands, say=said.append))
    assert [a.id for a in again.arm_data.prompts()] == [a.id for a in asks]
    for arm in ARMS:
        again.arm_data.arm_records(arm, asks)
    assert again.arm_data.assemble_arms() == json.loads(exp.files.stage("assemble").read_text())
    for arm in ARMS:
        again.arm_data.extract_arm(arm)
    assert {p: p.stat().st_mtime_ns for p in exp.files.root.rglob("*") if p.is_file()} == kept
    assert sum("done before: kept" in line for line in said) == 6


def test_both_arms_train_with_the_same_flags_but_their_data(tmp_path):
    config = tiny_config(tmp_path)
    a = train_args(config, tmp_path / "t", tmp_path / "on", tmp_path / "o1", train_samples=30, total_samples=36,
                   token_freq=tmp_path / "on.pt")
    b = train_args(config, tmp_path / "t", tmp_path / "off", tmp_path / "o2", train_samples=30, total_samples=36,
                   token_freq=tmp_path / "off.pt")
    differ = [(x, y) for x, y in zip(a, b) if x != y]
    assert len(a) == len(b) and len(differ) == 4 and "--seed" in a and "--train-data-ratio" in a


@pytest.mark.parametrize("ratio", [split_ratio, lambda train, total: train / total, lambda train, total: 0.9])
def test_the_trainers_split_falls_exactly_after_the_training_samples(ratio):
    """speculators keeps rows [0, int(total * ratio)) for training: with `split_ratio` that is every training
    sample and no validation one, for every size. Planted: train / total (float rounding: int(100 * 0.29) = 28) and
    speculators' default 0.9 are caught."""
    wrong = [(train, total) for total in range(2, 400) for train in range(1, total)
             if int(total * ratio(train, total)) != train]
    assert (wrong == []) == (ratio is split_ratio)
    with pytest.raises(InputError, match="both sides"):
        split_ratio(5, 5)


def test_losses_per_epoch_from_the_trainers_metric_records():
    records = [{"train": {"loss": 4.0}, "epoch": 0, "global_step": 0}, {"train": {"loss": 2.0}, "epoch": 0},
               {"val": {"loss_epoch": 5.0}, "epoch": 0}, {"train": {"loss": 1.0}, "epoch": 1},
               {"val": {"loss_epoch": 6.5}, "epoch": 1}]
    assert epoch_losses(records) == [{"epoch": 0, "train_loss": 3.0, "validation_loss": 5.0},
                                     {"epoch": 1, "train_loss": 1.0, "validation_loss": 6.5}]


def saved_epoch(out: Path, epoch: int, val_loss: float | None, *, best: bool = False, files=EPOCH_FILES) -> None:
    """What speculators leaves of one epoch in `out` (a `train_arm` folder): its step records, the epoch's folder
    with `files`, its link, and where `val_loss` is given its validation record (and `val_metrics.json` if `best`)."""
    folder = out / "checkpoints" / str(epoch)
    folder.mkdir(parents=True, exist_ok=True)
    for name in files:
        (folder / name).write_text("saved")
    (out / "checkpoints" / f"epoch{epoch}_end").symlink_to(str(epoch))
    records = [{"train": {"loss": 10.0 - epoch - step / 10}, "epoch": epoch, "global_step": 3 * epoch + step}
               for step in range(3)]
    if val_loss is not None:
        records.append({"val": {"loss_epoch": val_loss}, "epoch": epoch})
        if best:
            (folder / "val_metrics.json").write_text(json.dumps({"loss_epoch": val_loss}))
            (out / "checkpoints" / "checkpoint_best").unlink(missing_ok=True)
            (out / "checkpoints" / "checkpoint_best").symlink_to(str(epoch))
    with open(out / "metrics.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


COMMAND = ["python", "-m", "eagledata.quality.train", "metrics.jsonl", "--epochs", "6"]


def try_left(tmp_path: Path, *epochs: tuple[float | None, bool]) -> Path:
    """A training folder as a stopped try of COMMAND left it: one (validation loss, best) per epoch saved."""
    out = tmp_path / "train"
    out.mkdir()
    (out / "command.json").write_text(json.dumps(COMMAND))
    (out / "metrics.jsonl").write_text(json.dumps({"speculator_type": "eagle3", "seed": 0}) + "\n")
    for epoch, (val, best) in enumerate(epochs):
        saved_epoch(out, epoch, val, best=best)
    return out


def test_a_stopped_training_goes_on_after_its_last_whole_epoch(tmp_path):
    """`resume_point`: stopped inside epoch 2 (its steps logged, nothing saved), a try goes on after epoch 2; the
    epoch-2 step records are gone, the config record and epochs 0–1 stay exactly as they were."""
    out = try_left(tmp_path, (9.0, True), (8.0, True))
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"train": {"loss": 7.0}, "epoch": 2, "global_step": 6}) + "\n")
    (out / "checkpoints" / "interrupted").mkdir()  # a mid-epoch save on a signal: never resumed from here
    before = (out / "metrics.jsonl").read_text().splitlines()
    assert resume_point(out, COMMAND) == Resume(2)
    assert (out / "metrics.jsonl").read_text().splitlines() == before[:-1]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["0", "1", "checkpoint_best", "epoch0_end",
                                                                      "epoch1_end"]
    assert epoch_losses(read_metrics(out / "metrics.jsonl"))[-1] == {"epoch": 1, "train_loss": 8.9,
                                                                     "validation_loss": 8.0}


@pytest.mark.parametrize("left", ["files-missing", "unvalidated", "best-unmarked"])
def test_an_epoch_not_whole_is_trained_again(tmp_path, left):
    """Epoch 2 left not whole: its folder without two of its files, though validated (`files-missing`), saved but its
    validation not logged (`unvalidated`, as a mid-epoch save), validated lowest yet but not yet marked best
    (`best-unmarked`: speculators would resume with an older best). Each time the try goes on after epoch 1,
    and epoch 2's folder, link and records are gone. A worse epoch needs no mark: 2 is whole then."""
    out = try_left(tmp_path, (9.0, True), (8.0, True))
    if left == "files-missing":
        saved_epoch(out, 2, 8.5, files=EPOCH_FILES[:2])
    elif left == "unvalidated":
        saved_epoch(out, 2, None)
    else:
        saved_epoch(out, 2, 7.0, best=False)
    assert resume_point(out, COMMAND) == Resume(2)
    assert not (out / "checkpoints" / "2").exists() and not (out / "checkpoints" / "epoch2_end").is_symlink()
    assert {r.get("epoch") for r in read_metrics(out / "metrics.jsonl")} == {None, 0, 1}


def test_a_worse_epoch_is_whole_unmarked_and_another_command_starts_over(tmp_path):
    out = try_left(tmp_path, (9.0, True), (8.0, True), (8.5, False))
    assert resume_point(out, COMMAND) == Resume(3)
    assert not resume_point(out, [*COMMAND, "--seed", "1"])
    (out / "command.json").unlink()
    assert not resume_point(out, COMMAND)


def mid_epoch_saved(out: Path, epoch: int, local_step: int, global_step: int, *, torn: bool = False) -> None:
    """A mid-epoch checkpoint of `epoch` in `out` as speculators saves one (`--checkpoint-freq` below 1): the
    epoch's folder, training_state.json written last with the step it was saved after, its link; the epoch's step
    records through `global_step + 1` (logged after the save, before the stop). `torn`: the stop cut a later save
    of the same folder after it had rewritten the weights, before training_state.json."""
    folder = out / "checkpoints" / str(epoch)
    folder.mkdir(parents=True)
    for name in EPOCH_FILES[:-1]:
        (folder / name).write_text("saved")
    (folder / "training_state.json").write_text(json.dumps({"epoch": epoch, "local_step": local_step,
                                                           "global_step": global_step}))
    if torn:
        later = folder / "training_state.json"
        os.utime(folder / EPOCH_FILES[0], ns=(later.stat().st_atime_ns, later.stat().st_mtime_ns + 1_000_000))
    (out / "checkpoints" / f"epoch{epoch}_step{local_step}").symlink_to(str(epoch))
    with open(out / "metrics.jsonl", "a") as f:
        f.writelines(json.dumps({"train": {"loss": 7.0}, "epoch": epoch, "global_step": g}) + "\n"
                     for g in range(global_step - local_step, global_step + 2))


def test_a_stopped_training_goes_on_from_its_mid_epoch_checkpoint(tmp_path):
    """Epochs 0–1 whole and epoch 2 saved after its step 2 (global step 8): the next try goes on in epoch 2 after
    that step; the folder and its link stay, an epoch-3 folder (after it) goes, and the step records after the save
    (global steps 8 and 9, logged before the stop) go, those before it stay."""
    out = try_left(tmp_path, (9.0, True), (8.0, True))
    mid_epoch_saved(out, 2, local_step=2, global_step=8)
    saved_epoch(out, 3, None)
    before = (out / "metrics.jsonl").read_text().splitlines()
    resumed = resume_point(out, COMMAND)
    assert resumed == Resume(2, 2) and resumed.describe(6) == "in epoch 3 of 6 after its step 2"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["0", "1", "2", "checkpoint_best", "epoch0_end",
                                                                      "epoch1_end", "epoch2_step2"]
    steps = [r.get("global_step") for r in read_metrics(out / "metrics.jsonl") if r.get("epoch") == 2]
    assert steps == [6, 7]
    assert (out / "metrics.jsonl").read_text().splitlines() == [line for line in before if '"epoch": 3' not in line
                                                                and '"global_step": 8' not in line
                                                                and '"global_step": 9' not in line]


@pytest.mark.parametrize("left", ["torn", "end-unvalidated", "another-epoch"])
def test_a_mid_epoch_checkpoint_not_saved_whole_is_not_gone_on_from(tmp_path, left):
    """A checkpoint of epoch 2 a try cannot go on from: its weights rewritten after its training_state.json (a stop
    while saving over it: `torn`), saved at the epoch's end but not validated (local step 0), or stating another
    epoch than its folder's. The try goes on after epoch 1; the folder and epoch 2's records are gone."""
    out = try_left(tmp_path, (9.0, True), (8.0, True))
    mid_epoch_saved(out, 2, local_step=0 if left == "end-unvalidated" else 2, global_step=8, torn=left == "torn")
    if left == "another-epoch":
        (out / "checkpoints" / "2" / "training_state.json").write_text(
            json.dumps({"epoch": 1, "local_step": 2, "global_step": 8}))
    assert resume_point(out, COMMAND) == Resume(2)
    assert not (out / "checkpoints" / "2").exists() and not (out / "checkpoints" / "epoch2_step2").is_symlink()
    assert {r.get("epoch") for r in read_metrics(out / "metrics.jsonl")} == {None, 0, 1}


def made_data(config):
    return make_data(Experiment(config, ExperimentSeams(run=no_commands, say=lambda s: None)))


def test_each_arm_trains_on_all_its_samples_validated_on_the_same_held_out_conversations(tmp_path):
    """The trainer (a stand-in reading its flags as speculators does) keeps rows [0, int(n * ratio)) of the export
    for training and the rest for validation: every training sample of each arm and no held-out one; the held-out
    rows are the same (conversation, turn)s in both arms; the draft vocabulary's counts are one file's for both;
    the losses per epoch reach the stage."""
    calls = {}

    def trainer(cmd, env, log_file, label):
        flags = dict(zip(cmd[4::2], cmd[5::2], strict=True))  # [python, -m, module, metrics, --flag, value, ...]
        from datasets import load_from_disk

        calls[label] = (flags, list(load_from_disk(flags["--data-path"])["id"]))
        save = Path(flags["--save-path"])
        (save / "1").mkdir(parents=True)
        (save / "1" / "config.json").write_text("{}")
        Path(cmd[3]).write_text("".join(json.dumps(r) + "\n" for r in [
            {"train": {"loss": 3.0}, "epoch": 0}, {"val": {"loss_epoch": 4.0}, "epoch": 0},
            {"train": {"loss": 2.0}, "epoch": 1}, {"val": {"loss_epoch": 4.5}, "epoch": 1}]))

    exp = made_data(tiny_config(tmp_path))
    exp.seams.run = trainer
    held = exp.arm_data.validation_ids()
    train_rows, validation_rows, vocab = {}, {}, {}
    for arm in ARMS:
        exp.drafter_stages.train_arm(arm)
        flags, rows = calls[f"train {arm}"]
        samples = exp.arm_data.samples(arm)
        assert rows == [x.id for x in samples]  # the rows the trainer splits, in the order written
        cut = int(len(samples) * float(flags["--train-data-ratio"]))  # speculators' own expression
        train_rows[arm], validation_rows[arm] = samples[:cut], samples[cut:]
        assert train_rows[arm] == exp.arm_data.train_samples(arm)
        assert not {s.conversation_id for s in train_rows[arm]} & held
        assert validation_rows[arm] and {s.conversation_id for s in validation_rows[arm]} <= held
        vocab[arm] = torch.load(flags["--token-freq-path"], weights_only=True)
        stage = json.loads(exp.files.stage(f"train/{arm}").read_text())
        assert stage["train_samples"] == len(train_rows[arm]) and stage["validation_samples"] == len(
            validation_rows[arm])
        assert stage["epoch_losses"] == [{"epoch": 0, "train_loss": 3.0, "validation_loss": 4.0},
                                         {"epoch": 1, "train_loss": 2.0, "validation_loss": 4.5}]
    reported = json.loads(exp.files.stage("assemble").read_text())["supervised_tokens"]  # what tau.json reports
    assert supervised(train_rows["on_policy"]) == supervised(train_rows["off_policy"]) == reported
    keys = {arm: [(s.conversation_id, s.turn) for s in rows] for arm, rows in validation_rows.items()}
    assert keys["on_policy"] == keys["off_policy"]
    assert vocab["on_policy"] == vocab["off_policy"] == exp.arm_data.shared_vocabulary()
    assert sum(vocab["on_policy"].values()) == 2 * supervised(train_rows["on_policy"])


def test_a_learning_curves_size_trains_on_the_first_samples_of_the_data_experiment_through_a_view(tmp_path):
    """`train_tokens` on data linked from another experiment (`data_from`): each arm's trainer reads a view of the
    export (`rows_view`) whose training rows are the first of that experiment's in order up to exactly the asked
    supervised tokens (the crossing one trimmed, its states the first positions of its row's), then the very same
    validation rows; whole rows' states linked, not extracted again; the draft vocabulary counted over what is
    trained. More tokens than the arms hold is refused, naming the setting; a sample that is not its row's tokens
    is refused, naming the row's file."""
    from datasets import load_from_disk
    from safetensors.torch import load_file

    from eagledata.training.storage.speculators import rows_view, state_file

    full = made_data(tiny_config(tmp_path))
    have = json.loads(full.files.stage("assemble").read_text())["supervised_tokens"]
    cap = have // 2 + 1
    seen = {}

    def trainer(cmd, env, log_file, label):
        flags = dict(zip(cmd[4::2], cmd[5::2], strict=True))
        seen[label] = flags
        save = Path(flags["--save-path"])
        (save / "1").mkdir(parents=True)
        (save / "1" / "config.json").write_text("{}")
        Path(cmd[3]).write_text(json.dumps({"val": {"loss_epoch": 4.0}, "epoch": 0}) + "\n")

    curve = Experiment(tiny_config(tmp_path, experiment="tiny-t", data_from="tiny", train_tokens=cap),
                       ExperimentSeams(run=trainer, say=lambda s: None))
    share_data(curve.config, lambda s: None)
    trimmed = 0
    for arm in ARMS:
        curve.drafter_stages.train_arm(arm)
        flags = seen[f"train {arm}"]
        view = Path(flags["--data-path"])
        assert view == curve.files.train_view(arm)
        rows = load_from_disk(str(view)).with_format(None)  # plain lists
        cut = int(len(rows) * float(flags["--train-data-ratio"]))
        everything = full.arm_data.samples(arm)
        train, total = full.arm_data.split(arm)
        assert sum(sum(m) for m in rows["loss_mask"][:cut]) == cap  # exactly the asked tokens, both arms
        assert list(rows["id"][:cut]) == [s.id for s in everything[:cut]]  # the first training samples, in order
        assert list(rows["id"][cut:]) == [s.id for s in everything[train:total]]  # the same validation rows
        assert rows["input_ids"][cut:] == [s.input_ids for s in everything[train:total]]
        for j, i in enumerate([*range(cut), *range(train, total)]):
            mine, theirs = view / state_file(j), full.files.export(arm) / state_file(i)
            n = len(rows["input_ids"][j])
            if n == len(everything[i]):
                assert mine.stat().st_ino == theirs.stat().st_ino  # linked, not written again
            else:
                trimmed += 1
                got, source = load_file(str(mine)), load_file(str(theirs))
                assert torch.equal(got["hidden_states"], source["hidden_states"][:n])
                assert got["token_ids"].tolist() == everything[i].input_ids[:n]
        freq = torch.load(flags["--token-freq-path"], weights_only=True)
        assert sum(freq.values()) == 2 * cap
        stage = json.loads(curve.files.stage(f"train/{arm}").read_text())
        assert stage["train_samples"] == cut and stage["settings"]["train_tokens"] == cap
    assert trimmed >= 1  # the cap falls inside an answer in at least one arm

    too_many = Experiment(tiny_config(tmp_path, experiment="tiny-t2", data_from="tiny", train_tokens=have + 1),
                          ExperimentSeams(run=trainer, say=lambda s: None))
    share_data(too_many.config, lambda s: None)
    with pytest.raises(InputError, match=f"field 'train_tokens': {have + 1:,} asked, the arms' training samples hold "
                                         f"{have:,} supervised tokens"):
        too_many.drafter_stages.train_arm("on_policy")
    other = full.arm_data.samples("on_policy")[1]
    with pytest.raises(InputError, match="is not row 0's tokens") as e:
        rows_view(full.files.export("on_policy"), tmp_path / "wrong", [(0, other)])
    assert str(full.files.export("on_policy") / state_file(0)) in str(e.value)


def ablation_data(tmp_path: Path, **settings) -> ArmData:
    """Assembled data of two arms written by hand (no states: what the ablations choose is read from the samples
    and records): conversations c0..c3, turn 1 and turn 2 each, training; v0 held out. Answers of 4 supervised
    tokens on-policy and 3 off-policy; c1's turn-1 answers and c2's turn-2 on-policy answer were cut by the cap."""
    config = QualityConfig(experiment="ablation", output_dir=str(tmp_path), **settings)
    data = ArmData(Workspace(config, ExperimentSeams()))
    files = data.ws.files
    cut = {"on_policy": {"c1", "c2#2"}, "off_policy": {"c1"}}
    for arm, n in [("on_policy", 4), ("off_policy", 3)]:
        samples = [Sample(f"{c}" if t == 1 else f"{c}#{t}", arm, [1, 2] + [10 * t + k for k in range(n)],
                          [0, 0] + [1] * n, False, conversation_id=c, turn=t)
                   for c in ("c0", "c1", "c2", "c3", "v0") for t in (1, 2)]
        files.samples(arm).parent.mkdir(parents=True, exist_ok=True)
        files.samples(arm).write_text("".join(json.dumps(x.to_speculators()) + "\n" for x in samples))
        files.records(arm).write_text("".join(json.dumps({"id": x.id, "finish_reason": "length" if x.id in cut[arm]
                                                          else "stop"}) + "\n" for x in samples))
    files.stage("assemble").parent.mkdir(parents=True, exist_ok=True)
    files.stage("assemble").write_text(json.dumps({"train_samples": {a: 8 for a in ARMS},
                                                   "validation_samples": {a: 2 for a in ARMS}}))
    return data


@pytest.mark.parametrize(("settings", "off", "on", "tokens"), [
    ({"train_turns": "first"}, ["c0", "c1", "c2", "c3"], ["c0", "c1", "c2"], 12),
    ({"train_cut_answers": False}, ["c0", "c0#2", "c1#2", "c2", "c2#2", "c3", "c3#2"],
     ["c0", "c0#2", "c1#2", "c2", "c3", "c3#2"], 21),
    ({"train_turns": "first", "train_cut_answers": False}, ["c0", "c2", "c3"], ["c0", "c2", "c3"], 9),
    ({"train_tokens": 10}, ["c0", "c0#2", "c1", "c1#2"], ["c0", "c0#2", "c1"], 10)])
def test_the_ablations_train_on_first_turns_or_whole_answers_at_equal_tokens(tmp_path, settings, off, on, tokens):
    """Issue 62's ablations: `train_turns` first keeps turn-1 samples, `train_cut_answers` False leaves out every
    sample whose record the cap cut (each arm its own: c2's turn 2 on-policy only); then both arms at equal
    supervised tokens, the smaller arm's or `train_tokens`, in (conversation, turn) order, the crossing one trimmed
    (on-policy's third sample in the last case). The held-out v0 is never trained on."""
    data = ablation_data(tmp_path, **settings)
    trained = {arm: data.train_samples(arm) for arm in ARMS}
    assert [s.id for s in trained["off_policy"]] == off and [s.id for s in trained["on_policy"]] == on
    assert supervised(trained["on_policy"]) == supervised(trained["off_policy"]) == tokens


def test_one_draft_vocabulary_for_every_ablation_with_draft_vocabulary_data(tmp_path):
    """`draft_vocabulary` data counts all training samples of both arms, whatever an ablation trains on: the first-
    turn and the whole-answer ablations get the same counts; `trained` gives each its own."""
    def vocabulary(name, **settings):
        return ablation_data(tmp_path / name, **settings).shared_vocabulary()

    first, whole = vocabulary("a", train_turns="first", draft_vocabulary="data"), vocabulary(
        "b", train_cut_answers=False, draft_vocabulary="data")
    assert first == whole and sum(first.values()) == 8 * 4 + 8 * 3
    assert vocabulary("c", train_turns="first") != vocabulary("d", train_cut_answers=False)


def test_an_ablation_that_leaves_an_arm_nothing_is_refused(tmp_path):
    data = ablation_data(tmp_path, train_turns="first", train_cut_answers=False, train_tokens=100)
    with pytest.raises(InputError, match="100 asked, the arms' training samples hold 9 supervised tokens of those "
                                         "train_turns and train_cut_answers keep"):
        data.train_samples("on_policy")
    (data.ws.files.records("off_policy")).write_text("".join(  # every off-policy answer cut: nothing left
        json.dumps({"id": x.id, "finish_reason": "length"}) + "\n" for x in data.samples("off_policy")))
    with pytest.raises(InputError, match="no training sample of off_policy is left by train_turns 'first' and "
                                         "train_cut_answers False"):
        data.train_samples("on_policy")


def test_a_validation_split_that_differs_between_arms_is_not_shared():
    """Planted: the off-policy arm's validation with a turn the on-policy arm lacks; `shared_validation` keeps only
    the turns both have."""
    from eagledata.quality.arms import shared_validation
    from eagledata.training.assembly import Sample

    def s(cid, turn):
        return Sample(f"{cid}#{turn}", "d", [1, 2], [0, 1], False, conversation_id=cid, turn=turn)

    out = shared_validation({"on_policy": [s("a", 1), s("b", 1)], "off_policy": [s("b", 1), s("a", 2), s("a", 1)]})
    assert [(x.conversation_id, x.turn) for x in out["on_policy"]] == [("a", 1), ("b", 1)]
    assert [(x.conversation_id, x.turn) for x in out["off_policy"]] == [("a", 1), ("b", 1)]


def test_a_failed_command_names_its_log_and_last_lines(tmp_path):
    log = tmp_path / "x.log"
    with pytest.raises(RuntimeError, match=r"(?s)train on_policy failed \(exit 3\).*x\.log.*the last words"):
        run_logged([sys.executable, "-c", "print('the last words'); raise SystemExit(3)"], {}, log,
                   "train on_policy", say=lambda s: None)


def sleeper(pid_file: Path) -> list[str]:
    """A command that writes its pid, says a line, then sleeps for two minutes."""
    return [sys.executable, "-u", "-c", "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); "
            "time.sleep(0.3); print('step 1'); time.sleep(120)", str(pid_file)]


def ended(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def pid_in(path: Path) -> int:
    for _ in range(400):
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"the command wrote no pid to {path}")


def test_a_command_does_not_outlive_an_interrupt_and_stop_commands_ends_those_of_other_threads(tmp_path):
    """A kernel's interrupt signals the kernel alone: the command `run_logged` started ends with the interrupted
    call (planted by hand: without it the sleeper outlives the call). Commands run from other threads (the arms'
    trainers side by side) are ended by `stop_commands`, their calls failing as a failed command does."""
    def interrupt(line):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_logged(sleeper(tmp_path / "a.pid"), {}, tmp_path / "a.log", "train on_policy", interval_s=0.1,
                   say=interrupt)
    assert ended(pid_in(tmp_path / "a.pid"))

    failed: list[str] = []

    def run(name):
        try:
            run_logged(sleeper(tmp_path / f"{name}.pid"), {}, tmp_path / f"{name}.log", name, say=lambda s: None)
        except RuntimeError as e:
            failed.append(str(e).splitlines()[0])

    threads = [threading.Thread(target=run, args=(arm,)) for arm in ARMS]
    for t in threads:
        t.start()
    pids = [pid_in(tmp_path / f"{arm}.pid") for arm in ARMS]
    stop_commands()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads) and all(ended(pid) for pid in pids)
    assert sorted(failed) == [f"{arm} failed (exit -15); its log: {tmp_path / f'{arm}.log'}" for arm in sorted(ARMS)]


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
    Experiment(config, ExperimentSeams(run=no_commands, say=lambda s: None)).arm_data.prompts()
    wider = tiny_config(tmp_path, conversations=9)
    with pytest.raises(InputError, match=r"stage prompts was made with other settings \(conversations 8 there, 9"):
        Experiment(wider, ExperimentSeams(run=no_commands, say=lambda s: None)).arm_data.prompts()
    later = tiny_config(tmp_path, questions=1)  # a later stage's setting: the prompts are kept
    assert len(Experiment(later, ExperimentSeams(run=no_commands, say=lambda s: None)).arm_data.prompts()) == 11


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
    asks = make_data(first).arm_data.prompts()
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
    assert [a.id for a in again.arm_data.prompts()] == [a.id for a in asks]
    for arm in ARMS:
        again.arm_data.arm_records(arm, asks)
        again.arm_data.extract_arm(arm)
        freq = "hidden_states/speculators/token_freq.pt"
        assert (again.files.arm(arm) / freq).stat().st_ino == (first.files.arm(arm) / freq).stat().st_ino
        assert again.arm_data.samples(arm) == first.arm_data.samples(arm)
    kept = again.arm_data.assemble_arms()  # the first's stage, marked as linked (its cost is the first's)
    assert kept.pop("linked_from") == str(first.files.root)
    assert kept == json.loads(first.files.stage("assemble").read_text())
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


def test_a_greedy_trace_the_data_experiment_kept_is_linked_too(tmp_path):
    """The trace (the verifier's greedy decode of MT-Bench: no data or trainer setting reaches it) is linked with
    the data where that experiment kept it with the same settings; one made with other questions is not (said);
    none kept there, this experiment records its own."""
    first = Experiment(tiny_config(tmp_path), ExperimentSeams(run=no_commands, say=lambda s: None))
    make_data(first)
    seeded = tiny_config(tmp_path, experiment="tiny-seed1", seed=1, data_from="tiny")
    share_data(seeded, lambda s: None)
    here = Experiment(seeded).files
    assert not here.trace.exists() and not here.stage("trace").exists()
    first.files.trace.write_bytes(b"the trace")
    first.files.stage("trace").write_text(json.dumps({"settings": stage_settings(first.config, "trace")}))
    said: list[str] = []
    share_data(seeded, said.append)
    assert said == [f"[trace] linked from {first.files.root}"]
    assert here.trace.stat().st_ino == first.files.trace.stat().st_ino and here.stage("trace").is_file()
    other = tiny_config(tmp_path, experiment="tiny-q2", seed=1, data_from="tiny", questions=1)
    share_data(other, said.append)
    assert said[-1].startswith(f"[trace] not linked from {first.files.root}, made with other settings (questions ")
    assert not Experiment(other).files.trace.exists()


def test_conversations_are_drawn_from_the_whole_file_by_the_data_seed():
    """`data_seed`: a seeded draw over the whole file (not its first N), the same for the same seed, another for
    another, the held-out ones drawn the same way after the training ones. Planted: the file's order (seed None)
    draws the first N."""
    from types import SimpleNamespace

    from eagledata.quality.arm_data import choose_conversations

    file = [SimpleNamespace(id=f"c{i:03d}", messages=[{"role": "user", "content": f"q{i}"},
                                                      {"role": "assistant", "content": f"a{i}"}]) for i in range(300)]

    def draw(seed, n=30):
        return [a.id for a in choose_conversations(file, n, 2, seed)[0]]

    first = draw(0)
    assert first == draw(0) and first != draw(1) and len(set(first)) == 30
    assert max(int(i[1:]) for i in first) > 200 and sorted(first) != first  # from the whole file, not its head
    assert draw(0, 40)[:30] == first  # train, then held out: more of the same draw
    assert draw(None) == [f"c{i:03d}" for i in range(30)]  # the plant: the first N in file order
    assert draw(None) != first


def test_a_drawn_conversation_holding_an_mtbench_question_is_passed_over():
    """Nothing of what τ is measured on is trained on: a ShareGPT conversation asking an MT-Bench turn (case and
    spacing aside) is passed over, counted. Planted: no exclusion draws it."""
    from types import SimpleNamespace

    from eagledata.quality.arm_data import choose_conversations

    question = "Compose an engaging travel blog post about a recent trip to Hawaii."
    file = [SimpleNamespace(id=f"c{i}", messages=[{"role": "user", "content": f"q{i}"},
                                                  {"role": "assistant", "content": f"a{i}"}]) for i in range(20)]
    file[3].messages[0]["content"] = ("Please:  compose an engaging travel blog post about a recent\ntrip to "
                                      "Hawaii. thanks")
    chosen, passed = choose_conversations(file, 19, 2, 0, exclude=[question, "   "])
    assert "c3" not in {a.id for a in chosen} and passed == {"holds an MT-Bench turn's text": 1}
    assert "c3" in {a.id for a in choose_conversations(file, 20, 2, 0)[0]}  # the plant: nothing excluded


def test_a_conversation_whose_first_prompt_leaves_no_room_for_an_answer_is_passed_over():
    """A first prompt the server would refuse (over sample_tokens − answer_tokens: CI's vLLM run drew a 2,548-token
    one for a 1,024-token sample) is passed over, counted, so both arms hold the same conversations. Planted: no
    check draws it."""
    from types import SimpleNamespace

    from eagledata.quality.arm_data import choose_conversations

    file = [SimpleNamespace(id=f"c{i}", messages=[{"role": "user", "content": "word " * (500 if i == 4 else 5)},
                                                  {"role": "assistant", "content": f"a{i}"}]) for i in range(10)]

    def fits(messages):
        return len(messages[-1]["content"].split()) <= 100

    chosen, passed = choose_conversations(file, 9, 2, 0, first_prompt_fits=fits)
    assert "c4" not in {a.id for a in chosen} and len(chosen) == 9
    assert passed == {"first prompt leaves no room for an answer in sample_tokens": 1}
    assert "c4" in {a.id for a in choose_conversations(file, 10, 2, 0)[0]}  # the plant: no check
