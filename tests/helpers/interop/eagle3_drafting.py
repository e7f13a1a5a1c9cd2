"""eagledata's EAGLE-3 drafting (`eagledata.quality.eagle3`) against speculators' own model, in the interop
environment (`make test-interop`: speculators 0.9.0), with eagledata's lib/ on PYTHONPATH:

    python eagle3_drafting.py CHECKPOINT VERIFIER SPEC.json OUT.json

SPEC.json: `{"k": k, "sequences": [[ids…], …], "prompts": [[ids…], …], "max_new_tokens": n}`. It loads the
checkpoint as speculators saved it (`load_eagle3`) and the verifier with transformers, then writes to OUT.json:
- `chain`: for every row j of each sequence, the k-token chain our drafter computes incrementally (the verified rows
  in a KV cache, the chain steps after them), each later step fed the sequence's own next token as the trainer's
  teacher forcing feeds it, against the k draft tokens of speculators' own forward (`Eagle3DraftModel.forward`, its
  training-time test) over the whole sequence: `compared`, `mismatches` and `max_logit_difference` (relative to the
  largest logit); `chain_window`: the same with the
  sliding window cut to WINDOW rows, so that it binds;
- `lossless`: per prompt, whether speculative decoding with the drafter emitted plain greedy decoding's tokens;
- `tau_trained` / `tau_untrained`: τ per prompt with the checkpoint, and with its fc and decoder layers re-drawn
  at random (the same vocabulary mapping and embeddings);
- `config`: what the checkpoint says (aux layers, layer types, norm_output, draft vocabulary).
"""
import copy
import json
import sys
from importlib.metadata import version

import torch
from transformers import AutoModelForCausalLM

from eagledata.quality.eagle3 import Eagle3Drafter, load_eagle3, random_layers
from eagledata.quality.speculative import Verifier, greedy_decode, speculative_decode

WINDOW = 6


def chain_against_speculators(model, drafter, target_model, sequences, k):
    """Our chains against speculators' forward: the draft tokens, and the logits of every step (caught at the
    shared `lm_head`), which move with any change to what a row attends to even where the argmax does not."""
    compared = mismatches = 0
    first_mismatch = None
    worst = 0.0
    logits = []
    hook = model.lm_head.register_forward_hook(lambda module, args, output: logits.append(output.detach()[0]))
    try:
        for n, ids in enumerate(sequences):
            rows = len(ids) - 1
            with torch.no_grad():
                hs = target_model(torch.tensor([ids]), output_hidden_states=True).hidden_states
                aux = torch.cat([hs[i][0] for i in drafter.aux_layers], dim=-1)
                # the trainer's alignment (speculators/models/eagle3/data.py shift_batch): row j = token j + 1,
                # state j
                logits.clear()
                theirs = model(hidden_states=aux[None, :-1], input_ids=torch.tensor([ids[1:]]),
                               document_ids=torch.zeros(1, rows, dtype=torch.long), ttt_steps=k)
            their_logits = list(logits)  # k × [rows, D]
            theirs = [[drafter.verifier_id(int(t)) for t in step[0]] for step in theirs]
            drafter.start()
            for j in range(rows):
                forced = (ids[j + 2:] + [0] * k)[:k - 1]  # the trainer pads the shifted tokens with 0
                logits.clear()
                mine = drafter.chain(ids[:j + 2], aux[j:j + 1], k, forced=forced)
                for s in range(k):
                    compared += 1
                    scale = float(their_logits[s][j].abs().max())
                    worst = max(worst, float((logits[s][-1] - their_logits[s][j]).abs().max()) / scale)
                    if mine[s] != theirs[s][j]:
                        mismatches += 1
                        first_mismatch = first_mismatch or {"sequence": n, "row": j, "step": s, "ours": mine[s],
                                                            "theirs": theirs[s][j]}
    finally:
        hook.remove()
    return {"compared": compared, "mismatches": mismatches, "first_mismatch": first_mismatch,
            "max_logit_difference": worst}


def untrained_copy(model, seed=0):
    """The checkpoint with its fc and decoder layers drawn at random (`eagle3-random:DIR`'s drafter)."""
    return random_layers(copy.deepcopy(model), seed)


def decode_all(target_model, drafter, prompts, k, max_new):
    lossless, taus = [], []
    for prompt in prompts:
        greedy = greedy_decode(Verifier(target_model), prompt, max_new_tokens=max_new)
        got = speculative_decode(Verifier(target_model, drafter.aux_layers), drafter, prompt, k=k,
                                 max_new_tokens=max_new)
        lossless.append(got.output_ids == greedy)
        taus.append(got.tau)
    return lossless, taus


def main(checkpoint, verifier, spec_file, out):
    spec = json.load(open(spec_file))
    k = spec["k"]
    model = load_eagle3(checkpoint)
    target_model = AutoModelForCausalLM.from_pretrained(verifier, dtype=torch.float32).eval()
    drafter = Eagle3Drafter(model)
    report = {"speculators": version("speculators"), "chain": chain_against_speculators(
        model, drafter, target_model, spec["sequences"], k)}
    # the same with a sliding window shorter than the sequences (speculators' default, 2,048, never binds here)
    narrow = copy.deepcopy(model)
    narrow.sliding_window = narrow.config.transformer_layer_config.sliding_window = WINDOW
    report["chain_window"] = chain_against_speculators(narrow, Eagle3Drafter(narrow), target_model,
                                                       spec["sequences"], k)
    report["lossless"], report["tau_trained"] = decode_all(target_model, drafter, spec["prompts"], k,
                                                           spec["max_new_tokens"])
    untrained = Eagle3Drafter(untrained_copy(model))
    lossless, report["tau_untrained"] = decode_all(target_model, untrained, spec["prompts"], k,
                                                   spec["max_new_tokens"])
    report["lossless"] += lossless
    layer_config = model.config.transformer_layer_config
    report["config"] = {"aux_layers": list(drafter.aux_layers), "layer_types": list(layer_config.layer_types or []),
                        "sliding_window": layer_config.sliding_window, "norm_output": bool(model.config.norm_output),
                        "draft_vocab_size": int(model.config.draft_vocab_size)}
    json.dump(report, open(out, "w"))


if __name__ == "__main__":
    main(*sys.argv[1:5])
