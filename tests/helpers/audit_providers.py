"""Test helper: "providers" that sample their outputs from tiny models, for the fidelity audit's honest test.

A faithful provider samples from the target itself (temperature 1, no top-k/top-p); a degraded one from a copy
whose weights were rounded to a few bits. A random model's next-token distribution is nearly uniform (logits of
std ~0.2 over the vocabulary), so `peaked_target` scales its LM head: with a peaked distribution, a degraded copy
puts its mass on other tokens and the target's NLL of its samples rises measurably.
"""
from __future__ import annotations

import copy
import json
from collections.abc import Sequence

import torch

from eagledata.training import Sample
from eagledata.training.tiny import build_tiny_model

SAMPLING = json.dumps({"temperature": 1.0}, sort_keys=True, separators=(",", ":"))


def peaked_target(*, vocab_size: int = 512, hidden_size: int = 64, num_layers: int = 4, head_scale: float = 20.0,
                  seed: int = 0) -> torch.nn.Module:
    """A tiny Llama whose LM head is scaled by `head_scale`, so its next-token distributions are peaked."""
    model = build_tiny_model("llama", vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers,
                             seed=seed)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
    return model


def rounded_copy(model: torch.nn.Module, bits: int) -> torch.nn.Module:
    """A copy with every weight matrix rounded to `bits` bits (symmetric, one scale per output row), as a
    mislabelled low-precision endpoint would serve it; norms and biases are kept."""
    degraded = copy.deepcopy(model)
    levels = 2 ** (bits - 1) - 1
    with torch.no_grad():
        for param in degraded.parameters():
            if param.dim() == 2:
                scale = param.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / levels
                param.copy_(torch.round(param / scale).clamp(-levels, levels) * scale)
    return degraded


def noised_copy(model: torch.nn.Module, relative_std: float, *, seed: int = 0) -> torch.nn.Module:
    """A copy with Gaussian noise added to every weight matrix (std = `relative_std` x the matrix's own std): a
    degraded endpoint whose damage is spread over every weight rather than rounded. On `peaked_target`, 0.22
    raises the target's NLL of the copy's samples by about a third (measured: +32 % on 60 prompts)."""
    degraded = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in degraded.parameters():
            if param.dim() == 2:
                param.add_(torch.randn(param.shape, generator=gen) * param.std() * relative_std)
    return degraded


def _answers(target: torch.nn.Module, degraded: torch.nn.Module, prompts: int, seed: int):
    """`prompts` prompts of 8 tokens answered by A and B from the target and C from `degraded` (outputs cut to
    16..48 tokens): (the generator, to draw more from; the prompts' ids; the samples: A's, B's, then C's)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 512, (prompts, 8), generator=gen).tolist()
    lengths = torch.randint(16, 49, (prompts,), generator=gen).tolist()
    samples = []
    for name, model, s in [("A", target, 1), ("B", target, 2), ("C", degraded, 3)]:
        samples += sample_provider(model, ids, name, new_tokens=48, lengths=lengths, seed=s)
    return gen, ids, samples


def junk_and_noise(*, prompts: int = 60, noise: float = 0.22, junk_tokens: int = 480,
                   seed: int = 1) -> tuple[torch.nn.Module, list[Sample]]:
    """Issue 30's case: three providers answer the same `prompts` prompts of 8 tokens (outputs cut to 16..48
    tokens). A and B sample the target (head x20, temperature 1), C a `noised_copy` of it (+~33 % NLL per token);
    A's answer to prompt 0 is junk instead: `junk_tokens` uniform random ids (a runaway stream, as long as the
    issue's: it lifted A's mean from ~2.4 to ~4.7 nats/token), id `A-junk`. Returns the target and the samples."""
    target = peaked_target(vocab_size=512, head_scale=20.0)
    gen, ids, samples = _answers(target, noised_copy(target, noise, seed=5), prompts, seed)
    junk = torch.randint(0, 512, (junk_tokens,), generator=gen).tolist()
    samples[0] = Sample("A-junk", "T1", ids[0] + junk, [0] * 8 + [1] * junk_tokens, False, provider="A",
                        sampling=samples[0].sampling)
    return target, samples


def three_providers(*, prompts: int = 48, bits: int = 3, seed: int = 1) -> tuple[torch.nn.Module, list[Sample]]:
    """The audit's honest case: `prompts` prompts of 8 tokens, answered by A and B from the target (head scaled
    x20, temperature 1) and by C from a copy rounded to `bits` bits, outputs cut to 16..48 tokens; plus one junk
    sample of A (random ids as output). Returns the target and the samples (A, B, C, then the junk one)."""
    target = peaked_target(vocab_size=512, head_scale=20.0)
    gen, ids, samples = _answers(target, rounded_copy(target, bits=bits), prompts, seed)
    junk = torch.randint(0, 512, (40,), generator=gen).tolist()
    samples.append(Sample("A-junk", "T1", ids[0] + junk, [0] * 8 + [1] * 40, False, provider="A",
                          sampling=samples[0].sampling))
    return target, samples


@torch.no_grad()
def sample_provider(model: torch.nn.Module, prompts: Sequence[Sequence[int]], provider: str, *, new_tokens: int,
                    lengths: Sequence[int] | None = None, seed: int = 0, dataset: str = "T1",
                    sampling: str = SAMPLING) -> list[Sample]:
    """One sample per prompt from `model` at temperature 1 (plain softmax sampling, no top-k/top-p), `new_tokens`
    each, then cut to `lengths[i]` (a prefix of a sample is a sample). Prompts must all have one length."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.tensor([list(p) for p in prompts])
    out = model(ids, use_cache=True)
    past, logits, produced = out.past_key_values, out.logits[:, -1], []
    for _ in range(new_tokens):
        token = torch.multinomial(torch.softmax(logits.float(), dim=-1), 1, generator=gen)
        produced.append(token)
        out = model(token, past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1]
    outputs = torch.cat(produced, dim=1).tolist()
    samples = []
    for i, (prompt, output) in enumerate(zip(prompts, outputs)):
        output = output[:lengths[i]] if lengths is not None else output
        samples.append(Sample(f"{provider}-{i}", dataset, list(prompt) + output, [0] * len(prompt) + [1] * len(output),
                              False, provider=provider, sampling=sampling))
    return samples
