"""Assembly's choice between answers to one prompt: a finished answer wins over one the model never ended (cut by
the run, or by max_tokens), whichever dataset comes first; and the settings that leave unfinished answers out.

Issue 53 (item 2): hidden_states.ipynb kept nine ~280-token `cut` stubs of an earlier dataset over finished answers
to the same prompts from a later one, because dedupe kept the first record of a prompt."""
import pytest

from eagledata.errors import InputError
from eagledata.records import CUT
from eagledata.training import AssemblyPolicy, assemble, assembly
from tests.helpers.records import make_record


def write(path, records):
    path.write_text("".join(r.to_json() + "\n" for r in records))
    return path


def ids(asm):
    return [s.id for s in asm.samples]


@pytest.mark.parametrize("unfinished", [CUT, "length"])
def test_a_later_finished_answer_replaces_an_earlier_unfinished_one(unfinished, tok, tmp_path):
    """B1 holds stubs, B2 finished answers to the same prompts: once under other ids (another prompt file), once
    under the same ids (the same prompt file in two datasets). The finished answers are kept at their own place, the
    stubs are left out as `replaced_by_finished`, and the assembly lists each replacement."""
    stub = make_record(tok, 1, finish=unfinished, words=6)
    same_id_stub = make_record(tok, 2, finish=unfinished, words=6)
    b1 = write(tmp_path / "b1.jsonl", [make_record(tok, 0), stub, same_id_stub, make_record(tok, 3)])
    other_id = make_record(tok, 1, dataset="B2", words=30)
    other_id.id = "b2-1"
    same_id = make_record(tok, 2, dataset="B2", words=30)
    b2 = write(tmp_path / "b2.jsonl", [other_id, same_id, make_record(tok, 4, dataset="B2")])

    asm = assemble([b1, b2])
    assert ids(asm) == ["r0", "r3", "b2-1", "r2", "r4"]
    assert [s.dataset for s in asm.samples] == ["B1", "B1", "B2", "B2", "B2"]
    assert not any(s.truncated for s in asm.samples)
    assert [r.finish_reason for r in asm.records] == ["stop"] * 5  # the records follow the samples
    assert asm.dropped == {"replaced_by_finished": 2}
    stats = asm.stats()
    assert stats["dropped_replaced_by_finished"] == 2 and stats["truncated_kept"] == 0
    assert asm.replaced == [
        assembly.Replacement("r1", "B1", unfinished, len(stub.output_ids), "b2-1", "B2"),
        assembly.Replacement("r2", "B1", unfinished, len(same_id_stub.output_ids), "r2", "B2")]
    assert asm.replacements_table() == [
        {"left_out": "r1", "dataset": "B1", "finish_reason": unfinished, "output_tokens": len(stub.output_ids),
         "kept": "b2-1", "kept_dataset": "B2"},
        {"left_out": "r2", "dataset": "B1", "finish_reason": unfinished, "output_tokens": len(same_id_stub.output_ids),
         "kept": "r2", "kept_dataset": "B2"}]

    # the other order: the finished answers come first and the stubs are plain duplicates, as before
    first = assemble([b2, b1])
    assert ids(first) == ["b2-1", "r2", "r4", "r0", "r3"]
    assert first.dropped == {"duplicate_prompt": 1, "duplicate_id": 1} and first.replaced == []
    # either order, the same answers are kept
    assert sorted(ids(first)) == sorted(ids(asm))


def test_only_a_finished_answer_that_is_kept_replaces(tok, tmp_path):
    """A stub stays when the finished answer cannot be kept itself (too long for `max_length`), when the later answer
    is unfinished too (the first stays), and when the two differ in prompt (same id only: a plain id clash)."""
    stub = make_record(tok, 1, finish=CUT, words=4)
    long_answer = make_record(tok, 1, dataset="B2", words=200)
    long_answer.id = "long"
    later_stub = make_record(tok, 5, finish=CUT, words=4, dataset="B2",
                             prompt=make_record(tok, 6).messages[0]["content"])
    b1 = write(tmp_path / "b1.jsonl", [stub, make_record(tok, 6, finish="length", words=4)])
    b2 = write(tmp_path / "b2.jsonl", [long_answer, later_stub])
    limit = len(long_answer.input_ids) - 1

    asm = assemble([b1, b2], policy=AssemblyPolicy(max_length=limit))
    assert ids(asm) == ["r1", "r6"]
    assert asm.dropped == {"duplicate_prompt": 2} and asm.replaced == []
    assert ids(assemble([b1, b2])) == ["r6", "long"]  # without the limit it does replace

    clash = make_record(tok, 1, prompt="another question entirely", dataset="B2", words=30)  # id r1, other prompt
    asm = assemble([b1, write(tmp_path / "b3.jsonl", [clash])])
    assert ids(asm) == ["r1", "r6"] and asm.dropped == {"duplicate_id": 1}


def test_the_rule_itself(tok):
    """`supersedes(later, earlier)`: same prompt ids, the later finished, the earlier not."""
    stub, done = make_record(tok, 1, finish=CUT), make_record(tok, 1, words=20)
    length = make_record(tok, 1, finish="length")
    assert assembly.supersedes(done, stub) and assembly.supersedes(done, length)
    assert not assembly.supersedes(stub, done) and not assembly.supersedes(length, stub)
    assert not assembly.supersedes(done, done)
    assert not assembly.supersedes(done, make_record(tok, 2, finish=CUT))


def test_multi_turn_stub_is_replaced_only_by_another_conversation(tok, tmp_path):
    """Dedupe never merges turns of one conversation: a turn's stub and a finished turn of the same conversation
    never meet (their prompts differ); another conversation's finished answer to the stub's prompt replaces it."""
    stub = make_record(tok, 1, finish=CUT)
    stub.conversation_id = "conv"
    done = make_record(tok, 1, words=10)
    done.id, done.conversation_id = "other", "other"
    asm = assemble([write(tmp_path / "r.jsonl", [stub, done])])
    assert ids(asm) == ["other"] and asm.dropped == {"replaced_by_finished": 1}


def test_keep_truncated_covers_cut_answers_too(tok, tmp_path):
    """`keep_truncated = False` leaves out every answer the model never ended: `length` and the run's `cut`."""
    path = write(tmp_path / "r.jsonl", [make_record(tok, 0), make_record(tok, 1, finish="length"),
                                        make_record(tok, 2, finish=CUT)])
    assert ids(assemble([path])) == ["r0", "r1", "r2"]
    asm = assemble([path], policy=AssemblyPolicy(keep_truncated=False))
    assert ids(asm) == ["r0"] and asm.dropped == {"truncated": 2}
    help = AssemblyPolicy.__dataclass_fields__["keep_truncated"].metadata["help"]
    assert "length" in help and "cut (" in help  # its help names both


def test_min_cut_tokens_leaves_out_short_cut_answers_only(tok, tmp_path):
    """`min_cut_tokens`: a `cut` answer with fewer output tokens is left out (`cut_too_short`); a cut answer at the
    bound, a short `length` answer and a short finished one stay. 0 (the default) keeps every cut answer."""
    short_cut = make_record(tok, 1, finish=CUT, words=2)
    long_cut = make_record(tok, 2, finish=CUT, words=40)
    short_length = make_record(tok, 3, finish="length", words=2)
    short_done = make_record(tok, 4, words=2)
    path = write(tmp_path / "r.jsonl", [short_cut, long_cut, short_length, short_done])
    bound = len(long_cut.output_ids)
    assert len(short_cut.output_ids) < bound and len(short_length.output_ids) < bound
    assert len(short_done.output_ids) < bound

    assert ids(assemble([path])) == ["r1", "r2", "r3", "r4"]
    asm = assemble([path], policy=AssemblyPolicy(min_cut_tokens=bound))
    assert ids(asm) == ["r2", "r3", "r4"] and asm.dropped == {"cut_too_short": 1}
    assert asm.stats()["dropped_cut_too_short"] == 1
    asm = assemble([path], policy=AssemblyPolicy(min_cut_tokens=bound + 1))
    assert ids(asm) == ["r3", "r4"] and asm.dropped == {"cut_too_short": 2}
    with pytest.raises(InputError, match="min_cut_tokens"):
        AssemblyPolicy(min_cut_tokens=-1)


def test_a_short_stub_left_out_does_not_keep_a_later_answer_out(tok, tmp_path):
    """A stub left out by `min_cut_tokens` is not a first record of its prompt: the later finished answer stays,
    counted once, as the stub's own reason."""
    stub = make_record(tok, 1, finish=CUT, words=2)
    done = make_record(tok, 1, words=30, dataset="B2")
    asm = assemble([write(tmp_path / "a.jsonl", [stub]), write(tmp_path / "b.jsonl", [done])],
                   policy=AssemblyPolicy(min_cut_tokens=len(stub.output_ids) + 1))
    assert ids(asm) == ["r1"] and asm.samples[0].dataset == "B2" and asm.dropped == {"cut_too_short": 1}


def test_min_cut_tokens_is_a_notebook_parameter():
    """The new setting is hidden_states.ipynb's parameter too (one definition: the config dataclass)."""
    from eagledata.training.config import HiddenStatesConfig

    cfg = HiddenStatesConfig.from_params({"min_cut_tokens": 300})
    assert cfg.assembly.min_cut_tokens == 300
    assert "min_cut_tokens = 0 " in HiddenStatesConfig.parameters_cell()


def test_a_second_family_is_checked_against_its_own_vocabulary(smollm2_dir, tmp_path):
    """SmolLM2's records (vocabulary 49,152) assembled with its tokenizer: K2.5's `<|im_end|>` id in one is refused,
    which K2.5's vocabulary (163,840) would have let through."""
    from eagledata.records import Record
    from eagledata.text import load_tokenizer, output_ids, prompt_ids

    smol = load_tokenizer(smollm2_dir)
    msgs = [{"role": "user", "content": "Hi"}]
    good = Record(id="s0", dataset="B1", messages=msgs, reasoning="", content="Hello!", finish_reason="stop",
                  prompt_ids=prompt_ids(smol, msgs), output_ids=output_ids(smol, "", "Hello!", "stop"))
    (tmp_path / "a").mkdir()
    asm = assemble([write(tmp_path / "a" / "records.jsonl", [good])], tok=smol)
    assert ids(asm) == ["s0"] and asm.samples[0].input_ids == good.prompt_ids + good.output_ids
    bad = good.to_dict() | {"id": "s1", "output_ids": good.output_ids[:-1] + [163586]}
    (tmp_path / "b").mkdir()
    path = write(tmp_path / "b" / "records.jsonl", [Record.from_dict(bad)])
    with pytest.raises(InputError, match=r"outside the vocabulary \(0\.\.49151\)"):
        assemble([path], tok=smol)
    assert ids(assemble([path])) == ["s1"]  # without the target's tokenizer: K2.5's vocabulary, as before


def test_a_pause_sample_is_replaced_by_its_turn_asked_again(tok, tmp_path):
    """Issue 60: a Ctrl-C's pause sample (`r1~1`, `meta.cut: interrupted`) and the answer the next run asked its turn
    again for share conversation, turn and prompt: the finished answer takes its place. A pause sample whose turn was
    never asked again (no later run) stays, as any cut sample; another turn of the conversation is never merged."""
    pause = make_record(tok, 1, finish=CUT, words=6)
    pause.id, pause.meta = "r1~1", {"cut": "interrupted"}
    answer = make_record(tok, 1, words=30)
    lone = make_record(tok, 2, finish=CUT, words=6)
    lone.id, lone.meta = "r2~1", {"cut": "interrupted"}
    second = make_record(tok, 1, prompt="a second turn's ask", words=8)
    second.id, second.conversation_id, second.turn = "r1#2", "r1", 2
    asm = assemble([write(tmp_path / "r.jsonl", [pause, lone, answer, second])])
    assert ids(asm) == ["r2~1", "r1", "r1#2"] and asm.dropped == {"replaced_by_finished": 1}
    assert asm.replaced == [assembly.Replacement("r1~1", "B1", CUT, len(pause.output_ids), "r1", "B1")]
