"""eagledata's batched EAGLE-3 drafting (`BatchEagle3Drafter`) against one `Eagle3Drafter` per row, in the interop
environment (speculators 0.9.0), with eagledata's lib/ on PYTHONPATH:

    python eagle3_batched.py VERIFIER OUT.json

Builds speculators' `Eagle3DraftModel` for the tiny VERIFIER as its trainer does before training (one layer,
a draft vocabulary of 64, its fc and decoder layer drawn at random: drafts spread over the vocabulary), then decodes
two-turn chats of different lengths three rows at a time (`speculative_decode_batch`, turns finishing and starting
at different steps, a second turn keeping the positions it shares with the first where the drafter does) once with
`BatchEagle3Drafter` and once with `PerRow` of `Eagle3Drafter` (which starts each turn over), for `norm_output` on
and off and a sliding window that binds or not. Writes per case: `calls` (proposals compared, each every busy row's
chain), `equal` (every call's chains the same), `max_logit_difference` (every step's draft logits, relative to
the largest), `distinct` (distinct draft tokens: the comparison has something to
tell apart), `accepted` (drafts accepted) and `lossless` (both decodes emitted plain greedy decoding's tokens).
"""
import json
import sys

import torch
from speculators.models.eagle3 import Eagle3DraftModel
from speculators.train.cli import create_transformer_layer_config
from transformers import AutoModelForCausalLM

from eagledata.quality.batch_verifier import BatchVerifier
from eagledata.quality.batched import PerRow, speculative_decode_batch
from eagledata.quality.eagle3 import BatchEagle3Drafter, Eagle3Drafter, random_layers
from eagledata.quality.speculative import Verifier, greedy_decode

K, ROWS, MAX_NEW, DRAFT_VOCAB = 4, 3, 24, 64


def draft_model(verifier, vocab, *, norm_output, window, seed=0):
    config = create_transformer_layer_config(verifier, 1, "llama", None, window, [])
    torch.manual_seed(seed)
    keep = torch.sort(torch.randperm(vocab)[:DRAFT_VOCAB]).values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[keep] = True
    model = Eagle3DraftModel.from_training_args(config, t2d=t2d, d2t=keep - torch.arange(DRAFT_VOCAB),
                                                verifier_name_or_path=verifier, draft_vocab_size=DRAFT_VOCAB,
                                                norm_before_residual=False, ttt_steps=K, draft_attn_impl="sdpa",
                                                norm_output=norm_output)
    return random_layers(model.eval(), seed)


class Recorded:
    """A batched drafter whose every proposal is kept, with the draft logits of each row's every step (caught at
    the drafter's `lm_head`: `BatchEagle3Drafter` runs it once a step over the rows in order, [rows, D]; each
    `Eagle3Drafter` once a step for its row, [1, n, D], the chain reading the last)."""

    def __init__(self, inner, model, batched):
        self.inner, self.model, self.batched = inner, model, batched
        self.aux_layers, self.calls, self.logits = inner.aux_layers, [], []

    def start(self, row, keep=0):
        return self.inner.start(row, keep)

    def propose(self, rows, k):
        caught = []
        hook = self.model.lm_head.register_forward_hook(lambda module, args, output: caught.append(output.detach()))
        try:
            drafts = self.inner.propose(rows, k)
        finally:
            hook.remove()
        if self.batched:
            logits = {r: torch.stack([step[i] for step in caught]) for i, r in enumerate(sorted(rows))}
        else:
            logits = {r: torch.stack([step[0, -1] for step in caught[i * k:(i + 1) * k]]) for i, r in enumerate(rows)}
        self.calls.append({r: list(d) for r, d in sorted(drafts.items())})
        self.logits.append(logits)
        return drafts


class FollowUps:
    """Each prompt, then (once answered) the prompt, its answer and three more tokens: a chat's next turn, which
    `speculative_decode_batch` gives to the row that decoded the first, keeping their shared positions where the
    drafter keeps its own (`BatchEagle3Drafter` does, `PerRow` starts over)."""

    def __init__(self, prompts):
        self.first, self.given, self.later, self.decoded = list(prompts), 0, [], {}

    def next_turn(self):
        if self.later:
            return self.later.pop(0)
        if self.given < len(self.first):
            self.given += 1
            return (self.given - 1, 0), self.first[self.given - 1]
        return None

    def finished(self, key, decoded):
        self.decoded[key] = decoded
        if key[1] == 0:
            self.later.append(((key[0], 1), [*self.first[key[0]], *decoded.output_ids, 7, 8, 9]))

    def prompts(self):
        return [*self.first, *([*p, *self.decoded[(i, 0)].output_ids, 7, 8, 9] for i, p in enumerate(self.first))]

    def results(self):
        return [self.decoded[(i, t)] for t in (0, 1) for i in range(len(self.first))]


def decode(target, drafter, model, prompts, batched):
    recorded = Recorded(drafter, model, batched)
    feed = FollowUps(prompts)
    speculative_decode_batch(BatchVerifier(target, ROWS, drafter.aux_layers), recorded, feed, k=K,
                             max_new_tokens=MAX_NEW)
    return recorded, feed


def main(verifier, out):
    target = AutoModelForCausalLM.from_pretrained(verifier, dtype=torch.float32).eval()
    vocab = target.config.vocab_size
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(6, vocab, (3 + (5 * i) % 17,), generator=g).tolist() for i in range(7)]
    cases = []
    for norm_output, window in ((True, 2048), (True, 6), (False, 6)):
        model = draft_model(verifier, vocab, norm_output=norm_output, window=window)
        batched, feed = decode(target, BatchEagle3Drafter(model, ROWS), model, prompts, True)
        per_row, alone = decode(target, PerRow(lambda _, m=model: Eagle3Drafter(m), ROWS), model, prompts, False)
        greedy = [greedy_decode(Verifier(target), p, max_new_tokens=MAX_NEW) for p in feed.prompts()]
        got = feed.results()
        worst = 0.0
        for ours, theirs in zip(batched.logits, per_row.logits):
            for r in theirs:
                scale = float(theirs[r].abs().max())
                worst = max(worst, float((ours[r] - theirs[r]).abs().max()) / scale)
        cases.append({"norm_output": norm_output, "window": window, "calls": len(batched.calls),
                      "equal": batched.calls == per_row.calls, "max_logit_difference": worst,
                      "distinct": len({t for call in batched.calls for d in call.values() for t in d}),
                      "accepted": sum(sum(d.accepted) for d in got),
                      "lossless": [d.output_ids for d in got] == greedy == [d.output_ids for d in alone.results()]})
    json.dump({"cases": cases}, open(out, "w"))


if __name__ == "__main__":
    main(*sys.argv[1:3])
