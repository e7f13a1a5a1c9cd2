"""Greedy speculative decoding (quality/speculative.py) on tiny Llamas: the output is plain greedy decoding's,
whatever the drafter; the target drafting for itself gives τ = k + 1; random weights give τ ≈ 1; each verifying
forward's accepted count is exact."""
from __future__ import annotations

import pytest
import torch

from eagledata.quality.batch_verifier import BatchVerifier
from eagledata.quality.batched import (
    BatchModelDrafter,
    GreedyVerifier,
    NoDrafts,
    PerRow,
    PromptFeed,
    speculative_decode_batch,
)
from eagledata.quality.speculative import ModelDrafter, NgramDrafter, Verifier, greedy_decode, speculative_decode
from tests.helpers.quality import FollowUps, KeepingStates, StatesChecked, hf_greedy, prompts, sharp_llama

MAX_NEW = 40


@pytest.fixture(scope="module")
def target_model():
    return sharp_llama(seed=0)


@pytest.fixture(scope="module")
def random_model():
    return sharp_llama(seed=1)


class Oracle:
    """Knows the greedy continuation and proposes it with the draft at `wrong_at` (1-based) replaced: every
    verifying forward must accept exactly wrong_at − 1 drafts (or k when wrong_at > k)."""

    aux_layers = None

    def __init__(self, prompt_len, continuation, wrong_at):
        self.prompt_len, self.continuation, self.wrong_at = prompt_len, continuation, wrong_at

    def start(self):
        pass

    def propose(self, ids, states, k):
        done = len(ids) - self.prompt_len
        drafts = list(self.continuation[done:done + k])
        if self.wrong_at <= k:
            drafts[self.wrong_at - 1] = (drafts[self.wrong_at - 1] + 1) % 256
        return drafts


class Junk:
    """Proposes ids the target never chooses here (all rejected) — or, with `lengths`, chains of other lengths."""

    aux_layers = None

    def __init__(self, length=None):
        self.length = length

    def start(self):
        pass

    def propose(self, ids, states, k):
        return [1] * (self.length if self.length is not None else k)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_speculative_output_is_greedy_output_whatever_the_drafter(target_model, random_model, k):
    target = Verifier(target_model)
    for prompt in prompts(6):
        expected = hf_greedy(target_model, prompt, MAX_NEW)
        assert greedy_decode(target, prompt, max_new_tokens=MAX_NEW) == expected
        for drafter in (ModelDrafter(target_model), ModelDrafter(random_model), Junk(), Junk(length=k - 1),
                        NgramDrafter(), NgramDrafter(2, 2), Oracle(len(prompt), expected + [7] * 8, wrong_at=2)):
            got = speculative_decode(target, drafter, prompt, k=k, max_new_tokens=MAX_NEW)
            assert got.output_ids == expected, type(drafter).__name__
            # every token after the prefill's first came from a verifying forward
            assert got.tokens >= len(expected) - 1 and got.tokens - (len(expected) - 1) <= k


def test_a_stop_id_ends_the_turn_where_greedy_ends_it(target_model):
    """The stop id is emitted and nothing after it, even when it is accepted mid-chain."""
    target = Verifier(target_model)
    for prompt in prompts(6, seed=3):
        free = hf_greedy(target_model, prompt, MAX_NEW)
        stop = free[len(free) // 2]
        expected = hf_greedy(target_model, prompt, MAX_NEW, eos=stop)
        assert expected == free[:free.index(stop) + 1]
        for drafter in (ModelDrafter(target_model), NgramDrafter()):
            got = speculative_decode(target, drafter, prompt, k=5, max_new_tokens=MAX_NEW, stop_ids={stop})
            assert got.output_ids == expected


@pytest.mark.parametrize("k", [1, 4, 7])
def test_the_target_drafting_for_itself_gives_tau_k_plus_one(target_model, k):
    target = Verifier(target_model)
    for prompt in prompts(4, seed=5):
        got = speculative_decode(target, ModelDrafter(target_model), prompt, k=k, max_new_tokens=MAX_NEW)
        assert got.accepted == [k] * got.steps and got.tau == k + 1
        assert got.steps == -(-(MAX_NEW - 1) // (k + 1))  # ceil: each forward yields k + 1, the cap cuts the last
        assert target.forwards > 0


def test_random_weights_give_tau_near_one(target_model, random_model):
    target = Verifier(target_model)
    steps = accepted = 0
    for prompt in prompts(8, seed=7):
        got = speculative_decode(target, ModelDrafter(random_model), prompt, k=5, max_new_tokens=MAX_NEW)
        steps, accepted = steps + got.steps, accepted + sum(got.accepted)
    assert steps > 8 * 30
    assert 1 + accepted / steps < 1.05


@pytest.mark.parametrize("wrong_at", [1, 2, 4, 6])
def test_each_forward_accepts_exactly_the_matching_prefix(target_model, wrong_at):
    target, k = Verifier(target_model), 5
    prompt = prompts(1, seed=11)[0]
    continuation = hf_greedy(target_model, prompt, MAX_NEW + k + 1)
    got = speculative_decode(target, Oracle(len(prompt), continuation, wrong_at), prompt, k=k,
                             max_new_tokens=MAX_NEW)
    accepted = min(wrong_at - 1, k)
    assert got.output_ids == continuation[:MAX_NEW]
    assert got.accepted == [accepted] * got.steps and got.tau == accepted + 1


def test_a_decoder_that_keeps_rejected_drafts_in_the_cache_is_caught(target_model, random_model):
    """The equality with greedy decoding has teeth: leave the rejected drafts' positions in the target's cache
    (a planted bug) and the output drifts from greedy."""

    class Forgetful(Verifier):
        def crop(self, length):
            pass

    drifted = 0
    for prompt in prompts(4, seed=13):
        expected = hf_greedy(target_model, prompt, MAX_NEW)
        got = speculative_decode(Forgetful(target_model), ModelDrafter(random_model), prompt, k=3,
                                 max_new_tokens=MAX_NEW)
        drifted += got.output_ids != expected
    assert drifted == 4


def test_bad_arguments_are_refused(target_model):
    target = Verifier(target_model)
    with pytest.raises(ValueError, match="k must be at least 1"):
        speculative_decode(target, Junk(), [5, 6], k=0, max_new_tokens=4)
    with pytest.raises(ValueError, match="proposed 4 tokens, more than k = 3"):
        speculative_decode(target, Junk(length=4), [5, 6], k=3, max_new_tokens=4)
    with pytest.raises(ValueError, match="needs a prompt"):
        speculative_decode(target, Junk(), [], k=3, max_new_tokens=4)

    class WantsStates(Junk):
        aux_layers = (1, 2, 3)

    with pytest.raises(ValueError, match=r"reads the verifier's layers \(1, 2, 3\)"):
        speculative_decode(target, WantsStates(), [5, 6], k=3, max_new_tokens=4)


# -- prompt lookup (vLLM's `method: ngram`) --------------------------------------------------------------------
def test_ngram_proposes_what_followed_the_most_recent_occurrence_of_the_longest_suffix():
    d = NgramDrafter(max_n=3, min_n=1)
    #        0  1  2  3  4  5  6  7  8  9 10 11
    ids = [9, 1, 2, 3, 4, 8, 1, 2, 5, 6, 1, 2]
    # suffix [5?]: n = 3 ([6, 1, 2]) nowhere earlier; n = 2 ([1, 2]) at 6 (most recent) and 1: after 6 → 5, 6, 1
    assert d.propose(ids, None, 3) == [5, 6, 1]
    # fewer than k follow the match when it lies near the end; the suffix itself is never its own match
    assert d.propose(ids, None, 8) == [5, 6, 1, 2]
    # a longer n wins over a more recent shorter one: [3, 4] occurs at 3 only, [4] later at 7
    assert d.propose([3, 4, 7, 7, 1, 4, 0, 3, 4], None, 2) == [7, 7]
    # min_n bounds the search: no bigram repeats, so no draft
    assert NgramDrafter(3, 2).propose([1, 2, 3, 1, 4, 2], None, 4) == []
    assert NgramDrafter(3, 1).propose([1, 2, 3, 1, 4, 2], None, 4) == [3, 1, 4, 2]
    assert d.propose([7], None, 3) == [] and d.propose([1, 2, 3], None, 3) == []
    with pytest.raises(ValueError, match="1 <= min <= max"):
        NgramDrafter(2, 3)


def test_ngram_counts_forwards_without_a_draft_and_wins_on_repetition(target_model):
    """A forward with no draft still runs and yields its bonus: it counts as a verifying forward with 0 drafted and
    0 accepted. On a target that repeats itself prompt lookup accepts."""
    target = Verifier(target_model)
    drafted = accepted = steps = 0
    for prompt in prompts(6, seed=17):
        got = speculative_decode(target, NgramDrafter(), prompt, k=4, max_new_tokens=MAX_NEW)
        assert len(got.drafted) == got.steps and all(0 <= a <= d <= 4 for a, d in zip(got.accepted, got.drafted))
        assert got.tokens >= len(got.output_ids) - 1
        drafted, accepted, steps = drafted + sum(got.drafted), accepted + sum(got.accepted), steps + got.steps
    assert 0 < drafted < 4 * steps and accepted > 0


# -- several turns in one batched forward (issue 59 item 3) --------------------------------------------------------
class Mixed:
    """Per row: no drafts at all (row 0), the target itself (row 1), junk (the others): rows of one forward with
    chains of 0, k and k rejected drafts."""

    def __init__(self, target_model):
        self.target_model = target_model

    def __call__(self, row):
        return [Junk(length=0), ModelDrafter(self.target_model)][row] if row < 2 else Junk()


def batched(verifier, drafter, prompts_, *, k, max_new_tokens=MAX_NEW, stop_ids=(), greedy=False):
    """Every prompt decoded by `speculative_decode_batch`, its chains verified by `verifier`'s forwards, or with
    `greedy` against its greedy decode run ahead (`GreedyVerifier`)."""
    if greedy:
        verifier = GreedyVerifier(verifier, k=k, max_new_tokens=max_new_tokens, stop_ids=stop_ids)
    feed = PromptFeed(prompts_)
    speculative_decode_batch(verifier, drafter, feed, k=k, max_new_tokens=max_new_tokens, stop_ids=stop_ids)
    return feed.results()


def uneven_prompts(n, seed):
    """Prompts of 4 to 19 tokens: the rows of one batch at different positions."""
    some = prompts(n, seed=seed)
    assert len({len(p) for p in some}) == n
    return some


def test_a_batched_forward_gives_each_row_what_it_gives_alone(target_model):
    """Rows of different lengths, padded in one forward: each row's logits and aux states are its own one-row
    forward's (to float rounding), on its second forward too (each row at its own positions)."""
    rows = uneven_prompts(3, seed=19)
    verifier = BatchVerifier(target_model, 3, aux_layers=(1, 3))
    first = verifier.forward(dict(enumerate(rows)))
    second = verifier.forward({0: [5, 6, 7], 2: [9]})  # row 1 sits this one out
    for r, prompt in enumerate(rows):
        alone = Verifier(target_model, aux_layers=(1, 3))
        alone.start()
        logits, states = alone.forward(prompt)
        assert torch.allclose(first[r].logits, logits, atol=1e-5) and torch.allclose(first[r].states, states, atol=1e-5)
        if r in second:
            logits, states = alone.forward([5, 6, 7] if r == 0 else [9])
            assert torch.allclose(second[r].logits, logits, atol=1e-5)
    assert [verifier.length(r) for r in range(3)] == [len(rows[0]) + 3, len(rows[1]), len(rows[2]) + 1]


def test_each_attention_layout_gives_each_row_what_it_gives_alone(target_model):
    """A forward's attention runs row by row for a long chain (a prefill), else over the range of rows from its
    first to its last (rows left out computed and dropped) or, where it leaves most of that range out, over a copy
    of its rows' keys: each gives every row its own one-row forward's logits."""
    some = uneven_prompts(3, seed=67)  # 4, 11 and 18 tokens: a short prefill in a batch, two long ones row by row
    verifier = BatchVerifier(target_model, 8)
    alone = {r: Verifier(target_model) for r in (0, 3, 7)}
    first = verifier.forward(dict(zip((0, 3, 7), some)))
    for r, prompt in zip((0, 3, 7), some):
        alone[r].start()
        logits, _ = alone[r].forward(prompt)
        assert torch.allclose(first[r].logits, logits, atol=1e-5)
    steps = [{0: [5, 6], 7: [9]},  # rows 0 … 7 for two of them: their keys copied
             {3: [11, 12, 13], 7: [14]},  # rows 3 … 7: the range, rows 4 … 6 dropped
             {0: [15], 3: [16, 17], 7: [18, 19, 20]}]  # the range again
    for chains in steps:
        got = verifier.forward(chains)
        for r, chain in chains.items():
            logits, _ = alone[r].forward(chain)
            assert torch.allclose(got[r].logits, logits, atol=1e-5), (chains, r)


def test_verify_reads_the_lm_head_only_through_each_rows_first_rejected_draft(target_model):
    """`verify` gives each row the verifier's greedy tokens through its first rejected draft (or its last), what
    the full logits' argmax gives there, and runs the LM head on exactly those positions, position by position over
    the rows still accepting; the aux states of every chain position come back, transformers' hidden states (the
    embeddings, a layer's input, the final norm's output) to float rounding."""
    rows = uneven_prompts(3, seed=41)
    greedy = [hf_greedy(target_model, p, 8) for p in rows]
    layers = len(target_model.model.layers)
    aux = (0, 2, layers)
    verifier, full = BatchVerifier(target_model, 3, aux_layers=aux), BatchVerifier(target_model, 3)
    for v in (verifier, full):
        first = v.forward(dict(enumerate(rows)), last_only=True)
        assert [int(first[r].logits[-1].argmax()) for r in range(3)] == [g[0] for g in greedy]
    wrong = (greedy[0][3] + 1) % 256
    chains = {0: [greedy[0][0], greedy[0][1], greedy[0][2], wrong, greedy[0][4]],  # 2 accepted, then rejected
              1: [greedy[1][0]],  # no draft
              2: greedy[2][:6]}  # all 5 accepted
    seen = []
    hook = verifier.head.register_forward_hook(lambda module, args, output: seen.append(args[0].shape[0]))
    try:
        verdicts = verifier.verify(chains)
    finally:
        hook.remove()
    assert [verdicts[r].best for r in range(3)] == [greedy[0][1:4], greedy[1][1:2], greedy[2][1:7]]
    assert seen == [3, 2, 2, 1, 1, 1] and sum(seen) == 3 + 1 + 6
    logits = full.forward(chains)
    for r in range(3):
        best = logits[r].logits.argmax(-1).tolist()
        assert verdicts[r].best == best[:len(verdicts[r].best)]
    for r, prompt in enumerate(rows):
        ids = [*prompt, *chains[r]]
        with torch.no_grad():
            hidden = target_model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        expected = torch.cat([hidden[i][0, len(prompt):] for i in aux], dim=-1)
        assert verdicts[r].states.shape == expected.shape and torch.allclose(verdicts[r].states, expected, atol=1e-5)


def test_a_row_keeps_its_positions_when_the_cache_grows(target_model):
    """The key/value buffers grow (256 positions at a time) while rows hold positions: a long row and a short one
    decode past the first growth and on, each still its own greedy decode."""
    long, short = prompts(3, seed=43)[2] * 14, prompts(2, seed=47)[1]
    assert 240 < len(long) < 256
    some = [long, short, short[::-1]]
    expected = [hf_greedy(target_model, p, MAX_NEW) for p in some]
    verifier = BatchVerifier(target_model, 2)
    assert [d.output_ids for d in batched(verifier, BatchModelDrafter(target_model, 2), some, k=3)] == expected
    assert verifier.capacity >= len(long) + MAX_NEW > 256
    assert [d.output_ids for d in batched(BatchVerifier(target_model, 2), NoDrafts(), some, k=3)] == expected


@pytest.mark.parametrize("greedy", [False, True], ids=["forwards", "greedy"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_batched_output_is_greedy_output_whatever_the_drafter(target_model, random_model, k, greedy):
    """More prompts than rows (finished rows take new turns), prompts of different lengths, rows whose chains are
    empty, full or rejected side by side: every turn is transformers' own greedy decode, verified by forwards over
    the chains or against the greedy decode run ahead."""
    some = uneven_prompts(7, seed=23)
    expected = [hf_greedy(target_model, p, MAX_NEW) for p in some]
    for drafter in (NoDrafts(), BatchModelDrafter(target_model, 3), BatchModelDrafter(random_model, 3),
                    PerRow(lambda _: NgramDrafter(), 3), PerRow(Mixed(target_model), 3)):
        got = batched(BatchVerifier(target_model, 3), drafter, some, k=k, greedy=greedy)
        assert [d.output_ids for d in got] == expected, type(drafter).__name__
        assert all(d.tokens - (len(d.output_ids) - 1) in range(k + 1) for d in got)


@pytest.mark.parametrize("greedy", [False, True], ids=["forwards", "greedy"])
def test_batched_rows_finish_at_different_times_where_greedy_ends_them(target_model, greedy):
    """A stop id reached by some turns early (mid-chain included) and by others never; a cap of one token (every
    turn done at its prefill): each turn ends where plain greedy decoding ends it, and counts what one turn at a
    time counts (a last chain's drafts accepted past the stop included)."""
    some = uneven_prompts(6, seed=29)
    free = [hf_greedy(target_model, p, MAX_NEW) for p in some]
    stop = free[0][len(free[0]) // 3]
    expected = [hf_greedy(target_model, p, MAX_NEW, eos=stop) for p in some]
    assert len({len(e) for e in expected}) > 1  # the rows do finish at different steps
    for drafter in (BatchModelDrafter(target_model, 4), PerRow(Mixed(target_model), 4)):
        got = batched(BatchVerifier(target_model, 4), drafter, some, k=4, stop_ids={stop}, greedy=greedy)
        assert [d.output_ids for d in got] == expected
        if isinstance(drafter, BatchModelDrafter):
            one = [speculative_decode(Verifier(target_model), ModelDrafter(target_model), p, k=4,
                                      max_new_tokens=MAX_NEW, stop_ids={stop}) for p in some]
            assert [(d.accepted, d.drafted) for d in got] == [(d.accepted, d.drafted) for d in one]
    got = batched(BatchVerifier(target_model, 4), BatchModelDrafter(target_model, 4), some, k=4, max_new_tokens=1,
                  greedy=greedy)
    assert [d.output_ids for d in got] == [f[:1] for f in free] and all(d.steps == 0 for d in got)


@pytest.mark.parametrize("greedy", [False, True], ids=["forwards", "greedy"])
def test_batched_tau_is_counted_as_one_turn_at_a_time(target_model, random_model, greedy):
    """The same drafts, acceptance and τ per turn as `speculative_decode` (self: k + 1 exactly; random ≈ 1; the
    empty chains of prompt lookup counted)."""
    some = uneven_prompts(5, seed=31)
    for k in (1, 4):
        got = batched(BatchVerifier(target_model, 2), BatchModelDrafter(target_model, 2), some, k=k, greedy=greedy)
        assert all(d.accepted == [k] * d.steps and d.tau == k + 1 for d in got)
    got = batched(BatchVerifier(target_model, 3), BatchModelDrafter(random_model, 3), some, k=5, greedy=greedy)
    assert 1 + sum(sum(d.accepted) for d in got) / sum(d.steps for d in got) < 1.05
    alone = [speculative_decode(Verifier(target_model), NgramDrafter(), p, k=4, max_new_tokens=MAX_NEW) for p in some]
    got = batched(BatchVerifier(target_model, 3), PerRow(lambda _: NgramDrafter(), 3), some, k=4, greedy=greedy)
    assert [(d.accepted, d.drafted) for d in got] == [(d.accepted, d.drafted) for d in alone]
    assert any(0 in d.drafted for d in got)


def test_greedy_verification_gives_the_drafter_the_states_and_counts_of_verifying_forwards(target_model):
    """Against the greedy decode run ahead, a drafter reading aux states gets those of the positions it is owed
    (transformers' hidden states to float rounding), and every turn's tokens, drafts accepted and chain lengths are
    verifying forwards' and one turn at a time's; the verifier runs one token per row a forward."""
    some = uneven_prompts(7, seed=53)
    aux = (0, 2, len(target_model.model.layers))
    stop = hf_greedy(target_model, some[0], MAX_NEW)[10]
    results = []
    for greedy in (False, True):
        inner = BatchVerifier(target_model, 3, aux_layers=aux)
        drafter = PerRow(lambda _: StatesChecked(target_model, aux), 3)
        got = batched(inner, drafter, some, k=4, stop_ids={stop}, greedy=greedy)
        assert max(d.worst for d in drafter.drafters) < 1e-4
        results.append([(d.output_ids, d.accepted, d.drafted) for d in got])
        if greedy:  # prefills, then forwards of one token per row: at most each turn's tokens and k more
            assert inner.forwards <= len(some) + max(len(d.output_ids) + 4 for d in got) * len(some)
    one = [speculative_decode(Verifier(target_model, aux), StatesChecked(target_model, aux), p, k=4,
                              max_new_tokens=MAX_NEW, stop_ids={stop}) for p in some]
    assert results[0] == results[1] == [(d.output_ids, d.accepted, d.drafted) for d in one]
    assert {a for _, accepted, _ in results[1] for a in accepted} == set(range(5))


def test_a_batched_decoder_that_keeps_a_rows_rejected_drafts_is_caught(target_model, random_model):
    """The batched equality has teeth: a row's crop that keeps its rejected drafts (planted) drifts from greedy."""

    class Forgetful(BatchVerifier):
        def crop(self, row, length):
            pass

    some = uneven_prompts(4, seed=37)
    expected = [hf_greedy(target_model, p, MAX_NEW) for p in some]
    got = batched(Forgetful(target_model, 2), BatchModelDrafter(random_model, 2), some, k=3)
    assert sum(d.output_ids != e for d, e in zip(got, expected)) == 4


def test_batched_bad_arguments_are_refused(target_model):
    with pytest.raises(ValueError, match="proposed 4 tokens, more than k = 3"):
        batched(BatchVerifier(target_model, 2), PerRow(lambda _: Junk(length=4), 2), [[5, 6]], k=3)
    with pytest.raises(ValueError, match="needs a prompt"):
        batched(BatchVerifier(target_model, 2), NoDrafts(), [[]], k=3)
    with pytest.raises(ValueError, match="at least one token"):
        BatchVerifier(target_model, 2).forward({0: []})


class CountingPrefills(BatchVerifier):
    """A batched verifier that counts the tokens its prefills feed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fed = []

    def prefill(self, prompts):
        self.fed += [len(p) for p in prompts.values()]
        return super().prefill(prompts)


@pytest.mark.parametrize("greedy", [False, True], ids=["forwards", "greedy"])
def test_a_next_turn_keeps_the_positions_it_shares_with_the_rows_last_turn(target_model, greedy):
    """A chat's second turn goes to the row that decoded its first and prefills only what follows their shared
    positions (the drafter keeping what it drew from them where it can: a drafter that starts over gets every
    state again); each turn is still transformers' greedy decode of its whole prompt, counted as one turn at a time
    counts it, and a drafter that keeps its positions gets the states of the positions it is owed."""
    first = uneven_prompts(5, seed=59)
    more = [prompts(5, seed=61)[i][:3 + i] for i in range(5)]
    aux = (1, len(target_model.model.layers))
    for make in (lambda: (NoDrafts(), None), lambda: (BatchModelDrafter(target_model, 3), None),
                 lambda: (KeepingStates(target_model, aux, 3), aux),
                 lambda: (PerRow(lambda _: StatesChecked(target_model, aux), 3), aux)):
        drafter, layers = make()
        verifier = CountingPrefills(target_model, 3, aux_layers=layers)
        feed = FollowUps(first, more)
        speculative_decode_batch(GreedyVerifier(verifier, k=4, max_new_tokens=MAX_NEW) if greedy else verifier,
                                 drafter, feed, k=4, max_new_tokens=MAX_NEW)
        prompts_ = [*first, *([*first[i], *feed.decoded[(i, 0)].output_ids, *more[i]] for i in range(5))]
        got = [feed.decoded[(i, t)] for t in (0, 1) for i in range(5)]
        assert [d.output_ids for d in got] == [hf_greedy(target_model, p, MAX_NEW) for p in prompts_]
        checks = getattr(drafter, "checks", None) or getattr(drafter, "drafters", None)
        if isinstance(drafter, (KeepingStates, PerRow)):
            assert max(c.worst for c in checks) < 1e-4
        if isinstance(drafter, BatchModelDrafter):
            alone = [speculative_decode(Verifier(target_model), ModelDrafter(target_model), p, k=4,
                                        max_new_tokens=MAX_NEW) for p in prompts_]
            assert [(d.accepted, d.drafted) for d in got] == [(d.accepted, d.drafted) for d in alone]
        if isinstance(drafter, PerRow):  # it starts over: every prompt prefilled whole
            assert sum(verifier.fed) == sum(len(p) for p in prompts_)
        else:  # second turns: only their last shared token, the rest of the answer's last chain and `more`
            assert sum(verifier.fed) <= sum(len(p) for p in first) + sum(len(m) + 1 + 5 + 1 for m in more)
