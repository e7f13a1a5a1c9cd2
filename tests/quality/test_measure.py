"""τ on an evaluation set (quality/measure.py): both turns, the second on the target's own first answer rendered
with its chat template; the command writes tau.json from checkpoint folders."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagledata.quality.measure import HFChat, decode_question, main, make_drafter, measure, measure_command
from eagledata.quality.speculative import ModelDrafter, Verifier, greedy_decode
from eagledata.quality.tau import TAU_FIELDS, read_tau
from tests.helpers.quality import sharp_llama, word_tokenizer

QUESTIONS = [{"question_id": 1, "category": "writing", "turns": ["w10 w11 w12", "w13 w14"]},
             {"question_id": 2, "category": "math", "turns": ["w20 w21 w22 w23 w24", "w25"]},
             {"question_id": 3, "category": "coding", "turns": ["w30", "w31 w32 w33"]}]


@pytest.fixture(scope="module")
def model():
    return sharp_llama(seed=0)


@pytest.fixture(scope="module")
def chat():
    return HFChat(word_tokenizer())


class Recording:
    """A Chat that keeps every conversation it rendered."""

    def __init__(self, chat):
        self.chat, self.rendered = chat, []

    def render(self, messages):
        self.rendered.append([dict(m) for m in messages])
        return self.chat.render(messages)

    def answer(self, output_ids):
        return self.chat.answer(output_ids)

    def stop_ids(self, model=None):
        return self.chat.stop_ids(model)


def test_the_chat_template_and_the_stop_ids(chat, model):
    ids = chat.render([{"role": "user", "content": "w10 w11"}])
    assert chat.tokenizer.convert_ids_to_tokens(ids) == ["<|im_start|>", "user", "w10", "w11", "<|im_end|>",
                                                         "<|im_start|>", "assistant"]
    assert chat.answer([10, 11, 2]) == "w10 w11"  # the end of turn left out of the text carried on
    model.generation_config.eos_token_id = [2, 7]
    try:
        assert chat.stop_ids(model) == {2, 7}
    finally:
        model.generation_config.eos_token_id = None


def test_the_second_turn_is_asked_on_the_targets_own_first_answer(chat, model):
    rec = Recording(chat)
    stop = chat.stop_ids(model)
    done = decode_question(Verifier(model), ModelDrafter(model), rec, ["w10 w11 w12", "w13 w14"], k=4,
                           max_new_tokens=24, stop_ids=stop, qid=1)
    first = greedy_decode(Verifier(model), chat.render([{"role": "user", "content": "w10 w11 w12"}]),
                          max_new_tokens=24, stop_ids=stop)
    assert done.turns[0].output_ids == first and done.answers[0] == chat.answer(first)
    assert rec.rendered[1] == [{"role": "user", "content": "w10 w11 w12"},
                               {"role": "assistant", "content": chat.answer(first)},
                               {"role": "user", "content": "w13 w14"}]
    second_prompt = chat.render(rec.rendered[1])
    assert done.turns[1].output_ids == greedy_decode(Verifier(model), second_prompt, max_new_tokens=24,
                                                     stop_ids=stop)
    assert done.turns[1].prompt_length == len(second_prompt)
    assert done.run().tau == 5.0 and done.run().output_tokens == sum(len(t.output_ids) for t in done.turns)


def test_every_drafter_decodes_what_the_target_decodes_alone(chat, model):
    class Q:
        def __init__(self, d):
            self.id, self.turns = d["question_id"], d["turns"]

    questions = [Q(d) for d in QUESTIONS]
    runs = {spec: measure(Verifier(model), make_drafter(spec, model, seed=1), chat, questions, k=3,
                          max_new_tokens=20, stop_ids={2})
            for spec in ("self", "random")}
    outputs = {spec: [[t.output_ids for t in q.turns] for q in r] for spec, r in runs.items()}
    assert outputs["self"] == outputs["random"]
    assert {q.run().tau for q in runs["self"]} == {4.0}
    assert all(q.run().tau < 1.3 for q in runs["random"])
    with pytest.raises(ValueError, match="unknown drafter 'medusa'"):
        make_drafter("medusa", model)


def test_the_command_writes_tau_json_from_checkpoint_folders(tmp_path, model, capsys):
    folder = tmp_path / "target"
    model.save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    questions = tmp_path / "question.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS) + '{"question_id": 4, "tur')
    out = tmp_path / "quality" / "tiny" / "on_policy" / "tau.json"
    assert main(["--verifier", str(folder), "--drafter", "self", "--questions", str(questions), "--out", str(out),
                 "--k", "5", "--max-new-tokens", "16", "--samples", "12", "--supervised-tokens", "3400",
                 "--train-seconds", "2.5", "--transcripts", str(tmp_path / "t.jsonl"), "--limit", "2"]) == 0
    doc = read_tau(out)
    assert list(doc)[:len(TAU_FIELDS)] == list(TAU_FIELDS)
    assert (doc["target"], doc["eval_set"], doc["questions"], doc["turns"], doc["k"], doc["greedy"]) == (
        str(folder), "mt_bench", 2, 4, 5, True)
    assert doc["tau_mean"] == 6.0 and doc["tau_ci95"] == [6.0, 6.0] and doc["per_position_acceptance"] == [1.0] * 5
    assert (doc["samples"], doc["supervised_tokens"], doc["train_seconds"], doc["drafter"]) == (12, 3400, 2.5, "self")
    lines = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [t["id"] for t in lines] == [1, 2] and all(len(t["answers"]) == 2 for t in lines)
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["tau_mean"] == 6.0


def test_the_command_for_another_environment_puts_only_this_package_on_its_path(tmp_path, monkeypatch):
    import eagledata.quality.measure as measure_module

    cmd, env = measure_command("/other/python", "--k", "3")
    assert cmd == ["/other/python", "-m", "eagledata.quality.measure", "--k", "3"]
    assert (Path(env["PYTHONPATH"]) / "eagledata" / "quality" / "measure.py").is_file()
    # installed as a wheel: a folder holding a link to the package, not the site-packages it lies in
    site = tmp_path / "site-packages" / "eagledata" / "quality"
    site.mkdir(parents=True)
    (site / "measure.py").write_text("")
    monkeypatch.setattr(measure_module, "__file__", str(site / "measure.py"))
    monkeypatch.setattr(measure_module.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    _, env = measure_command("/other/python")
    home = Path(env["PYTHONPATH"])
    assert home.parent == tmp_path / "tmp" and sorted(p.name for p in home.iterdir()) == ["eagledata"]
    assert (home / "eagledata").resolve() == site.parent


def test_what_runs_in_the_speculators_environment_imports_no_other_stage():
    """measure.py and train.py run in .venv-interop (torch, numpy, transformers, speculators; none of the project's
    other dependencies): everything they reach in the library, lazy imports included, stays within the quality stage
    and the stdlib-only top-level modules."""
    from tests.helpers.imports import import_graph

    graph = import_graph()
    reached, todo = set(), ["eagledata.quality.measure", "eagledata.quality.train"]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(graph[module])
    assert {"eagledata.quality.eagle3", "eagledata.quality.sources", "eagledata.prompts",
            "eagledata.quality.progress"} <= reached
    assert reached - {m for m in reached if m.startswith("eagledata.quality")} <= {
        "eagledata", "eagledata.errors", "eagledata.prompts", "eagledata.records", "eagledata.files",
        "eagledata.status", "eagledata.wheels"}


def test_the_free_drafters_are_selectable_and_lossless(chat, model):
    from eagledata.quality.speculative import NgramDrafter

    class Q:
        def __init__(self, d):
            self.id, self.turns, self.category = d["question_id"], d["turns"], d["category"]

    questions = [Q(d) for d in QUESTIONS]
    assert (make_drafter("ngram", model).max_n, make_drafter("ngram", model).min_n) == (4, 1)
    assert isinstance(make_drafter("ngram:3", model), NgramDrafter) and make_drafter("ngram:2-5", model).min_n == 2
    with pytest.raises(ValueError, match="ngram:MIN-MAX"):
        make_drafter("ngram:x", model)
    greedy = measure(Verifier(model), make_drafter("self", model), chat, questions, k=3, max_new_tokens=20,
                     stop_ids={2})
    lookup = measure(Verifier(model), make_drafter("ngram", model), chat, questions, k=3, max_new_tokens=20,
                     stop_ids={2})
    assert [[t.output_ids for t in q.turns] for q in lookup] == [[t.output_ids for t in q.turns] for q in greedy]
    assert [q.run().category for q in lookup] == ["writing", "math", "coding"]


def test_eagle3_random_draws_the_checkpoints_layers_and_keeps_the_rest(monkeypatch):
    """`eagle3-random:DIR` loads the checkpoint and redraws only fc and the decoder layers, seeded."""
    import torch

    import eagledata.quality.eagle3 as eagle3

    class Fake(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(99)
            self.fc, self.layers = torch.nn.Linear(8, 4), torch.nn.ModuleList([torch.nn.Linear(4, 4)])
            self.embed_tokens, self.norm = torch.nn.Embedding(10, 4), torch.nn.LayerNorm(4)

    built = []
    monkeypatch.setattr(eagle3, "Eagle3Drafter", lambda m: built.append(m) or m)
    trained = Fake()
    for spec, seed in (("eagle3:/ckpt", 0), ("eagle3-random:/ckpt", 0), ("eagle3-random:/ckpt", 1),
                       ("eagle3-random:/ckpt", 0)):
        make_drafter(spec, None, seed=seed, load_eagle3=lambda path: Fake())
    plain, r0, r1, again = built
    assert torch.equal(plain.fc.weight, trained.fc.weight)
    assert not torch.equal(r0.fc.weight, trained.fc.weight) and not torch.equal(r0.layers[0].weight,
                                                                                trained.layers[0].weight)
    assert torch.equal(r0.embed_tokens.weight, trained.embed_tokens.weight) and torch.equal(r0.fc.bias, trained.fc.bias)
    assert torch.equal(r0.fc.weight, again.fc.weight) and not torch.equal(r0.fc.weight, r1.fc.weight)
    assert float(r0.fc.weight.detach().std()) == pytest.approx(0.02, rel=0.5)


def test_fewer_questions_are_drawn_across_the_categories():
    """Not the first N in file order (MT-Bench's file holds its categories in blocks of 10)."""
    from eagledata.quality.measure import select_questions
    from eagledata.quality.sources import Question

    cats = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]
    bench = [Question(10 * c + i + 1, cat, ["q"]) for c, cat in enumerate(cats) for i in range(10)]
    picked = select_questions(bench, 24)
    assert len(picked) == 24 and {q.category for q in picked} == set(cats)
    assert all(sum(q.category == c for q in picked) == 3 for c in cats)
    assert [q.id for q in picked] == sorted(q.id for q in picked) and picked[:3] == bench[:3]
    assert select_questions(bench, 24) == picked  # deterministic
    ten = [q.category for q in select_questions(bench, 10)]
    assert {c: ten.count(c) for c in cats} == {c: 2 if c in ("writing", "roleplay") else 1 for c in cats}
    assert select_questions(bench, None) == bench == select_questions(bench, 200)


def test_workers_split_the_questions_and_merge_the_same_tau_json(tmp_path, model):
    folder = tmp_path / "target"
    model.save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    questions = tmp_path / "question.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    docs = []
    for workers in (1, 2):
        out = tmp_path / f"tau{workers}.json"
        assert main(["--verifier", str(folder), "--drafter", "ngram", "--questions", str(questions), "--out",
                     str(out), "--k", "3", "--max-new-tokens", "16", "--workers", str(workers)]) == 0
        docs.append(read_tau(out))
    one, two = docs
    assert two["workers"] == 2 and one["per_question"] == two["per_question"]
    for key in ("tau_mean", "tau_ci95", "tau_pooled", "per_position_acceptance", "per_category", "output_tokens"):
        assert one[key] == two[key], key
    assert sorted(one["per_category"]) == ["coding", "math", "writing"] and one["drafter"] == "ngram"


def test_batched_questions_decode_and_count_as_one_at_a_time(chat, model, tmp_path):
    """Two rows for three questions: turns of different questions share forwards, a second turn is asked on its own
    first answer once that has finished. Every drafter gives the same prompts, outputs, answers and per-forward
    counts as `measure` one turn at a time, the chains verified by batched forwards or against the greedy decode
    run ahead (`GreedyVerifier`); the command's `--batch` writes the same per-question τ either way."""
    from eagledata.quality.batch_verifier import BatchVerifier
    from eagledata.quality.batched import GreedyVerifier
    from eagledata.quality.measure import make_batch_drafter, measure_batched

    class Q:
        def __init__(self, d):
            self.id, self.turns, self.category = d["question_id"], d["turns"], d["category"]

    questions = [Q(d) for d in QUESTIONS]
    for spec in ("self", "random", "ngram"):
        alone = measure(Verifier(model), make_drafter(spec, model, seed=1), chat, questions, k=3, max_new_tokens=20,
                        stop_ids={2})
        for greedy in (False, True):
            drafter = make_batch_drafter(spec, model, 2, seed=1)
            verifier = BatchVerifier(model, 2, drafter.aux_layers)
            together = measure_batched(GreedyVerifier(verifier, k=3, max_new_tokens=20, stop_ids={2}) if greedy
                                       else verifier, drafter, chat, questions, k=3, max_new_tokens=20, stop_ids={2})
            assert [t.id for t in together] == [1, 2, 3]
            assert [t.answers for t in together] == [t.answers for t in alone]
            assert [[(d.prompt_length, d.output_ids, d.accepted, d.drafted) for d in t.turns] for t in together] == [
                [(d.prompt_length, d.output_ids, d.accepted, d.drafted) for d in t.turns] for t in alone], spec
            assert [t.run() for t in together] == [t.run() for t in alone]

    folder = tmp_path / "target"
    model.save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    file = tmp_path / "question.jsonl"
    file.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    docs = []
    for batch, verify in ((1, "greedy"), (2, "forwards"), (2, "greedy")):
        out = tmp_path / f"b{batch}-{verify}.json"
        assert main(["--verifier", str(folder), "--drafter", "ngram", "--questions", str(file), "--out", str(out),
                     "--k", "3", "--max-new-tokens", "16", "--batch", str(batch), "--verify", verify]) == 0
        docs.append(read_tau(out))
    assert [(d["batch"], d["verify"]) for d in docs] == [(1, "forwards"), (2, "forwards"), (2, "greedy")]
    assert docs[0]["per_question"] == docs[1]["per_question"] == docs[2]["per_question"]
