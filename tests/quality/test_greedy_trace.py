"""The verifier's greedy decode recorded once and replayed for every drafter (quality/greedy_trace.py): a drafter
measured against the trace gets the tokens, the counts and the aux states it gets against the live decode; a trace
that does not hold what a measurement reads is refused, never guessed."""
from __future__ import annotations

import json

import pytest
import torch

from eagledata.quality.batch_verifier import BatchVerifier
from eagledata.quality.batched import BatchModelDrafter, GreedyVerifier, NoDrafts, PerRow, speculative_decode_batch
from eagledata.quality.greedy_trace import GreedyTrace, TraceRecorder, TraceReplay
from eagledata.quality.measure import main
from eagledata.quality.speculative import NgramDrafter
from eagledata.quality.tau import read_tau
from tests.helpers.quality import (
    FollowUps,
    KeepingStates,
    StatesChecked,
    hf_greedy,
    prompts,
    sharp_llama,
    word_tokenizer,
)

MAX_NEW, K = 40, 4


@pytest.fixture(scope="module")
def target_model():
    return sharp_llama(seed=0)


def chats():
    """Five two-turn chats (the second turn on the first's answer), prompts of different lengths."""
    first = prompts(5, seed=71)
    more = [prompts(5, seed=73)[i][:2 + i] for i in range(5)]
    return first, more


def record(model, aux, *, stop_ids=(), complete_rows=True):
    first, more = chats()
    recorder = TraceRecorder(BatchVerifier(model, 3, aux_layers=aux))
    greedy = GreedyVerifier(recorder, k=K, max_new_tokens=MAX_NEW, stop_ids=stop_ids, complete_rows=complete_rows)
    feed = FollowUps(first, more)
    speculative_decode_batch(greedy, NoDrafts(), feed, k=K, max_new_tokens=MAX_NEW, stop_ids=stop_ids)
    greedy.complete()
    return recorder.trace(k=K, max_new_tokens=MAX_NEW, stop_ids=sorted(stop_ids)), feed


def decode(verifier, drafter, stop_ids=()):
    first, more = chats()
    feed = FollowUps(first, more)
    speculative_decode_batch(GreedyVerifier(verifier, k=K, max_new_tokens=MAX_NEW, stop_ids=stop_ids), drafter, feed,
                             k=K, max_new_tokens=MAX_NEW, stop_ids=stop_ids)
    return {key: (d.output_ids, d.accepted, d.drafted) for key, d in sorted(feed.decoded.items())}


def test_the_trace_holds_every_turn_its_greedy_tokens_through_the_end_and_k_on_and_their_states(target_model, tmp_path):
    aux = (1, len(target_model.model.layers))
    stop = hf_greedy(target_model, chats()[0][0], MAX_NEW)[12]  # one turn ends early, at a stop id
    trace, feed = record(target_model, aux, stop_ids={stop})
    assert len(trace.entries) == 10
    for (i, turn), decoded in feed.decoded.items():
        prompt = chats()[0][i] if turn == 0 else [*chats()[0][i], *feed.decoded[(i, 0)].output_ids, *chats()[1][i]]
        entry = trace.lookup(prompt)
        out = entry.tokens[entry.prompt:]
        # transformers' own greedy continuation, k past the turn's end (all a last chain can read)
        assert out == hf_greedy(target_model, prompt, len(decoded.output_ids) + K)
        assert out[:len(decoded.output_ids)] == decoded.output_ids
        with torch.no_grad():
            hidden = target_model(torch.tensor([entry.tokens[:-1]]), output_hidden_states=True).hidden_states
        assert entry.states.shape == (len(entry.tokens) - 1, 2 * 64)
        assert float((entry.states - torch.cat([hidden[i][0] for i in aux], -1)).abs().max()) < 1e-4
    trace.save(tmp_path / "trace.pt")
    again = GreedyTrace.load(tmp_path / "trace.pt")
    assert (again.k, again.max_new_tokens, again.aux_layers, again.stop_ids) == (K, MAX_NEW, aux, [stop])
    assert {p: (e.tokens, e.prompt) for p, e in again.entries.items()} == {
        p: (e.tokens, e.prompt) for p, e in trace.entries.items()}
    assert all(torch.equal(again.entries[p].states, e.states) for p, e in trace.entries.items())


def test_every_drafter_counts_against_the_trace_as_against_the_live_decode(target_model):
    """Drafters reading states (kept across turns or started over), a model drafting for itself (τ = k + 1: its
    last chains read k past each end) and prompt lookup: the same tokens, drafts accepted and chain lengths, the
    states to float rounding; no verifier forward."""
    aux = (1, len(target_model.model.layers))
    stop = hf_greedy(target_model, chats()[0][0], MAX_NEW)[12]
    trace, _ = record(target_model, aux, stop_ids={stop})
    makers = [lambda: KeepingStates(target_model, aux, 3),
              lambda: PerRow(lambda _: StatesChecked(target_model, aux), 3),
              lambda: BatchModelDrafter(target_model, 3), lambda: PerRow(lambda _: NgramDrafter(), 3)]
    for make in makers:
        live = decode(BatchVerifier(target_model, 3, aux_layers=aux), make(), {stop})
        drafter = make()
        replay = TraceReplay(trace, 3)
        assert decode(replay, drafter, {stop}) == live
        checks = getattr(drafter, "checks", None) or getattr(drafter, "drafters", None) or []
        assert all(c.worst < 1e-4 for c in checks if isinstance(c, StatesChecked))
        assert replay.forwards > 0


def test_a_trace_that_does_not_hold_what_a_drafter_reads_is_refused(target_model):
    """Planted: rows given their next turn as soon as they end (not decoded k on): a drafter whose last chains read
    past an end finds the trace short and fails, as do other prompts and another k."""
    short, _ = record(target_model, None, complete_rows=False)
    whole, _ = record(target_model, None)
    assert sum(len(e.tokens) for e in short.entries.values()) < sum(len(e.tokens) for e in whole.entries.values())
    with pytest.raises(ValueError, match="does not hold this step"):
        decode(TraceReplay(short, 3), BatchModelDrafter(target_model, 3))
    decode(TraceReplay(whole, 3), BatchModelDrafter(target_model, 3))
    with pytest.raises(ValueError, match="holds no turn with this prompt"):
        whole.lookup([7, 8, 9])
    with pytest.raises(ValueError, match="recorded with k 4"):
        whole.check(k=5, max_new_tokens=MAX_NEW)
    with pytest.raises(ValueError, match="one greedy token a forward"):
        TraceRecorder(BatchVerifier(target_model, 2)).verify({0: [1, 2]})


QUESTIONS = [{"question_id": 1, "category": "writing", "turns": ["w10 w11 w12", "w13 w14"]},
             {"question_id": 2, "category": "math", "turns": ["w20 w21 w22 w23 w24", "w25"]},
             {"question_id": 3, "category": "coding", "turns": ["w30", "w31 w32 w33"]}]


def test_the_command_records_with_no_drafter_and_measures_against_the_trace(tmp_path, target_model):
    """`--drafter none --record-trace` (τ = 1 exactly), then `--trace`: every question's τ and counts as the live
    decode gives them; flags that cannot go together are refused."""
    folder = tmp_path / "target"
    target_model.save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    file = tmp_path / "question.jsonl"
    file.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    common = ["--verifier", str(folder), "--questions", str(file), "--k", "3", "--max-new-tokens", "16", "--batch",
              "2"]
    trace = tmp_path / "trace.pt"
    assert main([*common, "--drafter", "none", "--out", str(tmp_path / "none.json"), "--record-trace", str(trace),
                 "--aux-layers", "1,2,4"]) == 0
    none = read_tau(tmp_path / "none.json")
    assert none["tau_mean"] == 1.0 and none["trace"] == str(trace) and len(GreedyTrace.load(trace).entries) == 6
    for spec in ("ngram", "self"):
        assert main([*common, "--drafter", spec, "--out", str(tmp_path / "live.json")]) == 0
        assert main([*common, "--drafter", spec, "--out", str(tmp_path / "replay.json"), "--trace", str(trace)]) == 0
        live, replay = read_tau(tmp_path / "live.json"), read_tau(tmp_path / "replay.json")
        assert replay["verify"] == "trace" and live["verify"] == "greedy"
        for key in ("per_question", "tau_mean", "tau_pooled", "per_position_acceptance", "output_tokens"):
            assert replay[key] == live[key], (spec, key)
    assert read_tau(tmp_path / "replay.json")["tau_mean"] == 4.0  # self: k + 1
    for wrong in (["--batch", "1"], ["--verify", "forwards"], ["--record-trace", str(tmp_path / "t2.pt")]):
        with pytest.raises(SystemExit):
            main([*common, "--drafter", "ngram", "--out", str(tmp_path / "x.json"), "--trace", str(trace), *wrong])
    with pytest.raises(ValueError, match="recorded with k 3"):
        main([*common, "--k", "2", "--drafter", "ngram", "--out", str(tmp_path / "x.json"), "--trace", str(trace)])
