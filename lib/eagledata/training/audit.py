"""Provider fidelity audit: does every provider's output look like the verifier's own, by the verifier's score?

Over a provider's tokens, the mean NLL under the verifier is H(q) + KL(q || p) (`scoring.py`): on the same prompts
and sampling settings, an endpoint that serves another model (a mislabelled quantization, another revision)
shows a different, normally higher, mean. The audit compares each provider with the pooled others, within each
(dataset, sampling) stratum only, and flags those that differ beyond chance at a family-wise level; separately
it lists single samples far outside their own group (garbage, a cut stream).

Statistics, and why:
- A provider's mean is token-weighted (sum of NLLs / tokens), a ratio estimator. Tokens within a sample are
  correlated (one prompt is harder than another), so its variance comes from per-sample sums, the samples being
  the independent units: V = k/(k-1) * sum_i (S_i - R n_i)^2 / (sum_i n_i)^2 (cluster-robust, "linearized").
- Difference from the others within each stratum, combined across strata with weights proportional to the
  provider's tokens there; a stratum counts when both sides have at least two samples. Never across sampling
  settings or datasets: a provider serving only a harder dataset is compared with others on that dataset.
- Two-sided test of diff / se against Student's t with Satterthwaite's effective degrees of freedom
  (`ratio_estimate`): a few long samples can carry a stratum, and a normal reference then gives about twice the
  false alarms at the tails Holm uses (measured on simulated heavy-tailed lengths). Holm's step-down over the
  tested providers, with one refinement: a provider rejected at a step leaves the reference of the ones tested
  after it, so one bad provider does not drag the pooled reference of the faithful ones. Under the complete null
  any false alarm needs the first step's Bonferroni rejection, so the family-wise rate stays at most
  `significance`. With two providers that differ, the one with the higher NLL is flagged (a different model
  normally scores higher: KL >= 0) and the other is left untested: which side is right cannot be told.
- Outliers (`sample_outliers`: robust z beyond `outlier_threshold`, judged within each (provider, dataset,
  sampling) group) are listed, counted per provider, and by default (`drop_outliers`) left out of everything
  above: a provider's mean, CI and tests use the bulk of its samples. One long junk answer can otherwise carry a
  provider's mean (issue 30: one stream of 480 random ids lifted a faithful provider from 2.40 to 4.28
  nats/token, which lifted the pooled reference above a degraded provider's 3.14, and all three were called
  consistent). Left out of the tests, the junk neither flags its provider nor hides another.
- Outlier share: so that a provider serving many junk samples cannot escape by having them all left out, each
  provider's outlier count among its judged samples (those in groups of at least `outlier_min_group`) is tested
  against the other providers' pooled count: one-sided, conditional on the total (Fisher's exact test, the
  hypergeometric tail: under the null every judged sample is equally likely to be an outlier, whoever served
  it), Holm over the providers at `outlier_share_significance`. A provider whose share is far above the
  others' is `suspect` with that evidence. One outlier among 60 samples is no finding (raw p = 1/3 against two
  providers of 60 with none); 6 of 60 against none of 120 is (Holm-adjusted p = 0.004 < 0.01, default 0.001
  needs 8). Junk beyond half of a group moves the group's median instead, and so the provider's bulk mean: the
  NLL test finds it. The two families' rates add up: under the complete null the chance of any suspect is at
  most `significance` + `outlier_share_significance` (the exact test is conservative: with a handful of outliers
  in all, small p-values cannot occur).

Everything here is pure (rows in, report out); `plot_audit` draws. Acting on a verdict (routing around a suspect)
is `eagledata.openrouter.routing.ignore_in_routing`, which takes the report: the training stage does not import
the OpenRouter one.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from ..errors import InputError
from ..settings import Settings, setting
from .scoring import ExcludeSamples, ScoreRow

FidelityVerdict = Literal["consistent", "suspect"]
UNKNOWN_PROVIDER = "(unknown)"  # rows whose records do not say who served them
MAD_TO_SD = 1.4826  # MAD of a normal distribution x this = its standard deviation


@dataclass(frozen=True, kw_only=True)
class AuditPolicy(Settings):
    """How sure the audit must be before it calls a provider suspect, and what counts as an outlier sample."""

    significance: float = setting(0.01, "audit: family-wise false-alarm rate over providers (Holm); CIs at 1 - it")
    min_provider_samples: int = setting(10, "audit: samples a provider needs, in strata shared with others, "
                                            "to be tested")
    outlier_threshold: float = setting(6.0, "audit: robust z (median/MAD, length-aware) beyond which a sample "
                                            "is an outlier")
    outlier_min_group: int = setting(8, "audit: samples a (provider, dataset, sampling) group needs before its "
                                        "outliers are judged")
    drop_outliers: bool = setting(True, "audit: leave outlier samples out of the provider means and tests (still "
                                        "listed, counted, tested as a share); False: one junk answer counts in "
                                        "its provider's mean and can hide another provider")
    outlier_share_significance: float = setting(0.001, "audit: family-wise level (Holm) of the test that a "
                                                       "provider's outlier share is above the others' (suspect)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.significance < 1:
            raise InputError(f"must be in (0, 1), got {self.significance}", field="significance")
        if not 0 < self.outlier_share_significance < 1:
            raise InputError(f"must be in (0, 1), got {self.outlier_share_significance}",
                             field="outlier_share_significance")
        if self.min_provider_samples < 2:
            raise InputError("must be at least 2 (a variance needs two samples)", field="min_provider_samples")
        if self.outlier_threshold <= 0:
            raise InputError("must be positive", field="outlier_threshold")
        if self.outlier_min_group < 3:
            raise InputError("must be at least 3 (a median and a MAD)", field="outlier_min_group")


# -- the report ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProviderAudit:
    """One provider's figures. `diff` etc. are NaN when it could not be tested (`tested` False). `samples` and
    `tokens` count all it served; its mean, CI and tests leave its `outliers` out (unless `drop_outliers` False)."""

    provider: str
    samples: int
    tokens: int
    mean_nll: float  # nats per output token, token-weighted, over its samples but the outliers (by default)
    ci_low: float
    ci_high: float
    strata: int  # (dataset, sampling) strata where it was compared with other providers
    compared_samples: int
    compared_tokens: int
    reference_nll: float  # the others' mean on the same strata, weighted as the provider's tokens are
    diff: float  # provider - reference, nats per token
    se: float
    df: float  # effective degrees of freedom of the difference's variance (Satterthwaite)
    z: float  # diff / se, referred to Student's t with `df`
    p: float
    p_adjusted: float  # Holm
    tested: bool
    verdict: FidelityVerdict
    evidence: str
    outliers: int = 0  # its samples listed as outliers
    judged_samples: int = 0  # its samples in groups large enough to have outliers judged
    outlier_share_p: float = math.nan  # outlier share above the others': Holm-adjusted p (NaN: not tested)


@dataclass(frozen=True)
class Outlier:
    """A sample far outside its own (provider, dataset, sampling) group: garbage, a cut stream, a wrong model."""

    id: str
    provider: str
    dataset: str
    sampling: str
    tokens: int
    mean_nll: float
    group_median: float  # its (provider, dataset, sampling) group's median mean NLL
    score: float  # robust z: (mean - median) / expected spread at its length


@dataclass(frozen=True)
class AuditReport:
    """What `audit` found: per provider (sorted by name) and the outlier samples (most extreme first)."""

    significance: float
    pooled_mean_nll: float
    providers: tuple[ProviderAudit, ...]
    outliers: tuple[Outlier, ...]
    policy: AuditPolicy = field(default_factory=AuditPolicy)

    @property
    def suspects(self) -> list[str]:
        return [p.provider for p in self.providers if p.verdict == "suspect"]

    def provider(self, name: str) -> ProviderAudit:
        for p in self.providers:
            if p.provider == name:
                return p
        raise KeyError(name)

    def exclusions(self) -> dict[str, str]:
        """{suspect provider: its evidence}: what `routing.ignore_in_routing` writes as the reasons."""
        return {p.provider: f"fidelity audit: {p.evidence}" for p in self.providers if p.verdict == "suspect"}

    def to_exclude(self, outliers: bool = True) -> ExcludeSamples:
        """What an export (`convert(..., exclude=)`) should leave out: every sample of the suspects and, with
        `outliers`, the outlier samples; the reason says why, with the evidence."""
        ids = tuple(o.id for o in self.outliers) if outliers else ()
        parts = [f"{p}: {why}" for p, why in self.exclusions().items()]
        if ids:
            parts.append(f"{len(ids)} outlier samples (robust z beyond {self.policy.outlier_threshold:g})")
        return ExcludeSamples(providers=tuple(self.suspects), ids=ids, reason="; ".join(parts))

    def to_publish(self) -> dict[str, Any]:
        """Plain JSON (NaN as None): what a notebook publishes and a test or a later stage reads."""
        def num(x: float) -> float | None:
            return float(x) if math.isfinite(x) else None

        return {"significance": self.significance, "pooled_mean_nll": num(self.pooled_mean_nll),
                "providers": {p.provider: {"samples": p.samples, "tokens": p.tokens, "mean_nll": num(p.mean_nll),
                                           "ci_low": num(p.ci_low), "ci_high": num(p.ci_high),
                                           "diff": num(p.diff), "z": num(p.z), "df": num(p.df), "p": num(p.p),
                                           "p_adjusted": num(p.p_adjusted), "tested": p.tested,
                                           "outliers": p.outliers, "judged_samples": p.judged_samples,
                                           "outlier_share_p": num(p.outlier_share_p),
                                           "verdict": p.verdict, "evidence": p.evidence}
                              for p in self.providers},
                "suspects": self.suspects,
                "outliers": [o.id for o in self.outliers]}

    def table(self):
        """One row per provider (pandas), the verdict and its evidence last."""
        import pandas as pd

        return pd.DataFrame([asdict(p) for p in self.providers]).set_index("provider")

    def outlier_table(self):
        import pandas as pd

        cols = ["id", "provider", "dataset", "sampling", "tokens", "mean_nll", "group_median", "score"]
        return pd.DataFrame([asdict(o) for o in self.outliers], columns=cols)


# -- the statistics (pure) --------------------------------------------------------------------------------
# Per (provider, stratum) cell we keep the moments the ratio estimator and its degrees of freedom need, so any
# pooling of cells (the others in a stratum) is a sum.
_K, _N, _S, _SS, _SN, _NN, _N3, _N4, _WSS, _WDF = range(10)
_MOMENTS = 10


def _moments(n: np.ndarray, s: np.ndarray, q: np.ndarray) -> np.ndarray:
    within = np.maximum(q - s * s / n, 0.0)  # each sample's sum of squared deviations from its own mean
    return np.array([len(n), n.sum(), s.sum(), (s * s).sum(), (s * n).sum(), (n * n).sum(), (n ** 3).sum(),
                     (n ** 4).sum(), within.sum(), (n - 1).sum()], dtype=np.float64)


@dataclass(frozen=True)
class Ratio:
    """A token-weighted mean NLL, its cluster-robust variance and that variance's effective degrees of freedom."""

    mean: float
    var: float  # NaN under two samples
    df: float


def ratio_estimate(m: np.ndarray) -> Ratio:
    """sum S / sum n from a cell's moments, V = k/(k-1) * sum_i (S_i - R n_i)^2 / N^2 (expanded into moments:
    sum S^2 - 2R sum S n + R^2 sum n^2), and V's degrees of freedom.

    The df: V is a sum of k squared residuals of unequal variance a_i, so it counts as (sum a)^2 / sum a^2 samples,
    not k (Satterthwaite). With a_i = tau^2 n_i^2 + sigma^2 n_i (a prompt-to-prompt spread tau of the sample
    means, and token noise sigma, from the samples' own sums of squares), a few long samples carry a cell: the
    normal approximation would then be too confident (measured: about twice the false alarms at alpha/4)."""
    k, n = m[_K], m[_N]
    if n <= 0:
        return Ratio(math.nan, math.nan, math.nan)
    r = float(m[_S] / n)
    if k < 2:
        return Ratio(r, math.nan, math.nan)
    rss = k / (k - 1) * max(m[_SS] - 2 * r * m[_SN] + r * r * m[_NN], 0.0)
    sigma2 = m[_WSS] / m[_WDF] if m[_WDF] > 0 else 0.0
    tau2 = max((rss - sigma2 * n) / m[_NN], 0.0)
    a1 = tau2 * m[_NN] + sigma2 * n
    a2 = tau2 ** 2 * m[_N4] + 2 * tau2 * sigma2 * m[_N3] + sigma2 ** 2 * m[_NN]
    effective = a1 * a1 / a2 if a2 > 0 else k
    return Ratio(r, float(rss / (n * n)), float(max(min(effective, k) - 1, 1.0)))


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom."""
    from scipy.stats import t as student_t

    return 0.0 if not math.isfinite(t) else float(2 * student_t.sf(abs(t), df))


def t_quantile(level: float, df: float) -> float:
    """The t such that P(|T| < t) = level."""
    from scipy.stats import t as student_t

    return float(student_t.ppf((1 + level) / 2, df))


@dataclass(frozen=True)
class _Comparison:
    strata: int
    samples: int
    tokens: int
    reference: float
    diff: float
    se: float
    df: float
    z: float
    p: float


def _compare(cells: np.ndarray, p: int, excluded: set[int]) -> _Comparison | None:
    """Provider `p` against the pooled providers not in `excluded`, stratum by stratum (cells: [P, strata, M]);
    t test with the Satterthwaite df of the strata's variance components."""
    others = [q for q in range(cells.shape[0]) if q != p and q not in excluded]
    if not others:
        return None
    ref = cells[others].sum(axis=0)  # [strata, M]; summed, not total minus mine: two providers tie exactly
    diffs, weights, refs, parts, samples, tokens = [], [], [], [], 0, 0
    for s in range(cells.shape[1]):
        mine, theirs = cells[p, s], ref[s]
        if mine[_K] < 2 or theirs[_K] < 2:
            continue
        a, b = ratio_estimate(mine), ratio_estimate(theirs)
        diffs.append(a.mean - b.mean)
        weights.append(mine[_N])
        refs.append(b.mean)
        parts.append((a, b))
        samples += int(mine[_K])
        tokens += int(mine[_N])
    if not diffs:
        return None
    w = np.asarray(weights) / np.sum(weights)
    diff = float(w @ np.asarray(diffs))
    components = [(wi * wi * x.var, x.df) for wi, pair in zip(w, parts) for x in pair]
    var = sum(c for c, _ in components)
    spread = sum(c * c / df for c, df in components)
    df = var * var / spread if spread > 0 else math.inf
    se = math.sqrt(var)
    z = diff / se if se > 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))
    return _Comparison(len(diffs), samples, tokens, float(w @ np.asarray(refs)), diff, se, df, z,
                       t_two_sided_p(z, df))


def audit(rows: Iterable[ScoreRow], policy: AuditPolicy | None = None) -> AuditReport:
    """Per provider: mean NLL with its CI, the stratified difference from the other providers, Holm-corrected
    verdicts with their evidence; the outlier samples, counted per provider, and the test of each provider's
    outlier share. Rows with no scored token are left out.

    By default (`policy.drop_outliers`) the outliers are left out of the means and tests: one junk sample can
    carry its provider's mean (and so the reference every other provider is compared with) and widen its
    variance; see the module's docstring."""
    policy = policy or AuditPolicy()
    rows = [r for r in rows if r.score.tokens > 0]
    if not rows:
        raise InputError("no scored samples to audit (every row has 0 tokens, or there are none)", field="rows")
    outliers = tuple(sample_outliers(rows, policy))
    served: dict[str, list[int]] = {}  # provider -> [samples, tokens], before any sample is left out
    for r in rows:
        counts = served.setdefault(r.provider or UNKNOWN_PROVIDER, [0, 0])
        counts[0] += 1
        counts[1] += r.score.tokens
    listed = {name: sum(o.provider == name for o in outliers) for name in served}
    judged = judged_samples(rows, policy)
    share_p = outlier_share_tests(listed, judged)
    share_suspects = {name for name, p in share_p.items() if p < policy.outlier_share_significance}
    if policy.drop_outliers:
        dropped = {o.id for o in outliers}
        rows = [r for r in rows if r.id not in dropped]
    alpha = policy.significance
    names = sorted(served)  # a provider whose every sample was an outlier keeps its row (and its share test)
    strata = sorted({(r.dataset, r.sampling) for r in rows})
    pi = {name: i for i, name in enumerate(names)}
    si = {key: i for i, key in enumerate(strata)}
    prov = np.array([pi[r.provider or UNKNOWN_PROVIDER] for r in rows])
    strat = np.array([si[(r.dataset, r.sampling)] for r in rows])
    n = np.array([r.score.tokens for r in rows], dtype=np.float64)
    s = np.array([r.score.nll_sum for r in rows], dtype=np.float64)
    q = np.array([r.score.nll_sumsq for r in rows], dtype=np.float64)
    cells = np.zeros((len(names), len(strata), _MOMENTS))
    for p in range(len(names)):
        for t in range(len(strata)):
            sel = (prov == p) & (strat == t)
            if sel.any():
                cells[p, t] = _moments(n[sel], s[sel], q[sel])

    # Holm step-down; a rejected provider leaves the reference of the later steps.
    first = {p: _compare(cells, p, set()) for p in range(len(names))}
    tested = [p for p, c in first.items() if c is not None and c.samples >= policy.min_provider_samples]
    m = len(tested)
    suspects: list[int] = []
    final: dict[int, _Comparison | None] = dict(first)
    adjusted: dict[int, float] = {}
    remaining, running = list(tested), 0.0
    while remaining:
        current = {p: _compare(cells, p, set(suspects)) for p in remaining}
        final.update(current)
        live = [p for p in remaining if current[p] is not None]
        remaining = live  # the others' only comparison was with providers already found suspect
        if not live:
            break
        live.sort(key=lambda p: (current[p].p, -current[p].diff, names[p]))  # type: ignore[union-attr]
        step = m - len(suspects)
        best = live[0]
        adj = min(1.0, max(running, step * current[best].p))  # type: ignore[union-attr]
        if adj < alpha:
            suspects.append(best)
            adjusted[best] = running = adj
            remaining.remove(best)
            continue
        for j, p in enumerate(live):  # no more rejections: the rest's adjusted p-values, monotone
            running = min(1.0, max(running, (step - j) * current[p].p))  # type: ignore[union-attr]
            adjusted[p] = running
        break

    pooled = float(s.sum() / n.sum())
    providers = []
    for p, name in enumerate(names):
        own = ratio_estimate(cells[p].sum(axis=0))
        mean = own.mean
        half = t_quantile(1 - alpha, own.df) * math.sqrt(own.var) if math.isfinite(own.var) else math.nan
        c = final[p]
        is_tested = p in adjusted or p in suspects
        by_nll: FidelityVerdict = "suspect" if p in suspects else "consistent"
        others = cells[[j for j in range(len(names)) if j != p], :, _K].sum(axis=0) > 0  # [strata]
        shared = int(cells[p, others, _K].sum())  # its samples in strata another provider served too
        evidence = _evidence(name, c, first[p], shared, is_tested, by_nll, adjusted.get(p, math.nan), alpha,
                             policy.min_provider_samples, [names[j] for j in suspects])
        evidence += _outlier_evidence(name, listed, judged, share_p, policy)
        verdict: FidelityVerdict = "suspect" if p in suspects or name in share_suspects else "consistent"
        nan = math.nan
        providers.append(ProviderAudit(
            provider=name, samples=served[name][0], tokens=served[name][1], mean_nll=mean,
            ci_low=mean - half, ci_high=mean + half,
            strata=c.strata if c else 0, compared_samples=c.samples if c else 0, compared_tokens=c.tokens if c else 0,
            reference_nll=c.reference if c and is_tested else nan, diff=c.diff if c and is_tested else nan,
            se=c.se if c and is_tested else nan, df=c.df if c and is_tested else nan,
            z=c.z if c and is_tested else nan,
            p=c.p if c and is_tested else nan, p_adjusted=adjusted.get(p, nan), tested=is_tested,
            verdict=verdict, evidence=evidence, outliers=listed[name], judged_samples=judged.get(name, 0),
            outlier_share_p=share_p.get(name, nan)))
    return AuditReport(alpha, pooled, tuple(providers), outliers, policy)


def _evidence(name: str, c: _Comparison | None, first: _Comparison | None, shared: int, tested: bool,
              verdict: FidelityVerdict, p_adj: float, alpha: float, min_samples: int, suspects: list[str]) -> str:
    """The verdict's reason as one sentence with its numbers."""
    if not shared:
        return "no other provider to compare with (alone in every dataset and sampling setting it served)"
    if first is None or (not tested and first.samples < min_samples):
        return (f"not tested: {first.samples if first else 0} comparable samples, {min_samples} needed (of its "
                f"{shared} in strata shared with other providers; a stratum needs 2 on each side)")
    if not tested or c is None:
        return ("not tested: its only comparison was with providers found suspect "
                f"({', '.join(s for s in suspects if s != name)})")
    ref = "the other providers" + (" not found suspect" if suspects and verdict == "consistent" else "")
    where = f"{c.samples} samples, {c.tokens:,} tokens in {c.strata} dataset/sampling strata"
    numbers = (f"{c.reference + c.diff:.4f} vs {c.reference:.4f} nats/token for {ref} on the same strata "
               f"({c.diff:+.4f}, z = {c.z:.2f} on {c.df:.0f} df, Holm-adjusted p = {p_adj:.2g}")
    if verdict == "suspect":
        side = "higher" if c.diff > 0 else "lower"
        return f"mean NLL under the verifier {side}: {numbers} < {alpha:g}; {where})"
    return f"no significant difference: {numbers} >= {alpha:g}; {where})"


def _outlier_evidence(name: str, listed: dict[str, int], judged: dict[str, int], share_p: dict[str, float],
                      policy: AuditPolicy) -> str:
    """What the outliers add to a provider's evidence: how many were left out, and the share test if it fired."""
    k = listed.get(name, 0)
    text = ""
    if k:
        text = (f"; {k} outlier sample{'s' if k > 1 else ''} (listed) "
                + ("left out of its mean and tests" if policy.drop_outliers else "counted in its mean and tests"))
    p = share_p.get(name, math.nan)
    if p < policy.outlier_share_significance:
        others_k = sum(v for n, v in listed.items() if n != name)
        others_n = sum(v for n, v in judged.items() if n != name)
        text += (f"; outlier share far above the others': {k} of its {judged[name]} judged samples against "
                 f"{others_k} of {others_n} (one-sided exact test, Holm-adjusted p = {p:.2g} < "
                 f"{policy.outlier_share_significance:g})")
    return text


def judged_samples(rows: Sequence[ScoreRow], policy: AuditPolicy | None = None) -> dict[str, int]:
    """Per provider, its scored samples in (provider, dataset, sampling) groups large enough for `sample_outliers`
    to judge (the denominators of the outlier-share test)."""
    policy = policy or AuditPolicy()
    out: dict[str, int] = {}
    for (provider, _, _), group in _outlier_groups(rows).items():
        if len(group) >= policy.outlier_min_group:
            out[provider] = out.get(provider, 0) + len(group)
    return out


def outlier_share_tests(outliers: dict[str, int], judged: dict[str, int]) -> dict[str, float]:
    """{provider: Holm-adjusted p} that its outlier share is above the other providers' pooled share.

    One-sided exact test conditional on the total count (Fisher's exact test on the 2x2 table: the
    hypergeometric tail P(X >= k) of drawing its n judged samples from all N with K outliers). Tested: providers
    with judged samples while another provider has some too."""
    from scipy.stats import hypergeom

    total_n = sum(judged.values())
    total_k = sum(outliers.get(name, 0) for name in judged)
    raw = {name: (float(hypergeom.sf(outliers.get(name, 0) - 1, total_n, total_k, n)) if total_k else 1.0)
           for name, n in judged.items() if 0 < n < total_n}
    return holm(raw)


def holm(p_values: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values (monotone, at most 1), in the input's keys."""
    order = sorted(p_values, key=lambda k: (p_values[k], k))
    out, running, m = {}, 0.0, len(order)
    for i, name in enumerate(order):
        running = min(1.0, max(running, (m - i) * p_values[name]))
        out[name] = running
    return out


def _outlier_groups(rows: Sequence[ScoreRow]) -> dict[tuple[str, str, str], list[ScoreRow]]:
    groups: dict[tuple[str, str, str], list[ScoreRow]] = {}
    for r in rows:
        if r.score.tokens > 0:
            groups.setdefault((r.provider or UNKNOWN_PROVIDER, r.dataset, r.sampling), []).append(r)
    return groups


def sample_outliers(rows: Sequence[ScoreRow], policy: AuditPolicy | None = None) -> list[Outlier]:
    """Samples whose mean NLL is far outside their (provider, dataset, sampling) group, most extreme first.

    Score = (x_i - median x) / sqrt(tau^2 + sigma^2 / n_i): x_i a sample's mean NLL over its n_i tokens, sigma^2
    the group's median per-token variance (from `nll_sumsq`), tau^2 the spread between prompts left in the MAD of
    x once the typical token noise is taken out (floored at 0). A short sample is noisier (sigma^2 / n_i), a long
    one is held to the prompt-to-prompt spread, not to a sqrt(n) that would flag every long hard prompt.

    Robust to the suspect provider's own shift: centre and spread are each group's own, so a provider shifted
    as a whole moves its median with it and its samples are judged against their own provider (the shift is the
    provider test's business); median and MAD ignore up to half of a group, so a few junk samples do not move the
    reference they are judged against, as a mean and a standard deviation would.
    """
    policy = policy or AuditPolicy()
    found = []
    for (provider, dataset, sampling), group in _outlier_groups(rows).items():
        if len(group) < policy.outlier_min_group:
            continue
        n = np.array([r.score.tokens for r in group], dtype=np.float64)
        x = np.array([r.score.nll_sum for r in group]) / n
        token_var = np.maximum(np.array([r.score.nll_sumsq for r in group]) / n - x * x, 0.0)
        centre = float(np.median(x))
        spread = MAD_TO_SD * float(np.median(np.abs(x - centre)))
        sigma2 = float(np.median(token_var))
        tau2 = max(spread ** 2 - float(np.median(sigma2 / n)), 0.0)
        scale = np.sqrt(tau2 + sigma2 / n)
        with np.errstate(divide="ignore", invalid="ignore"):
            score = np.where(scale > 0, (x - centre) / scale, np.where(x == centre, 0.0, np.inf * np.sign(x - centre)))
        for i in np.flatnonzero(np.abs(score) > policy.outlier_threshold):
            r = group[i]
            found.append(Outlier(r.id, provider, dataset, sampling, r.score.tokens, float(x[i]), centre,
                                 float(score[i])))
    return sorted(found, key=lambda o: -abs(o.score))


# -- the picture ----------------------------------------------------------------------------------------
def plot_audit(report: AuditReport, ax: Any = None) -> Any:
    """Mean NLL per provider with its CI at 1 - significance, the pooled mean, suspects in red.

    The bars are the providers' raw means over whatever they served; the verdicts come from the stratified
    comparison (a provider serving only a harder dataset sits higher here without being suspect)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(report.providers) + 2), 3.6))
    level = 100 * (1 - report.significance)
    for i, p in enumerate(report.providers):
        colour = "tab:red" if p.verdict == "suspect" else ("tab:blue" if p.tested else "0.55")
        err = [[p.mean_nll - p.ci_low], [p.ci_high - p.mean_nll]] if math.isfinite(p.ci_low) else None
        ax.errorbar(i, p.mean_nll, yerr=err, fmt="o", color=colour, capsize=4)
        if p.verdict == "suspect":
            ax.annotate("suspect", (i, p.ci_high if math.isfinite(p.ci_high) else p.mean_nll),
                        textcoords="offset points", xytext=(0, 6), ha="center", color="tab:red", fontsize=8)
    ax.axhline(report.pooled_mean_nll, color="0.4", ls="--", lw=1, label=f"pooled {report.pooled_mean_nll:.3f}")
    ax.set_xticks(range(len(report.providers)), [p.provider for p in report.providers], rotation=30, ha="right")
    ax.set_ylabel("mean NLL under the verifier (nats/token)")
    ax.set_title(f"Provider fidelity: mean NLL with {level:g}% CI (red = suspect, grey = not tested)")
    ax.legend(fontsize=8)
    return ax
