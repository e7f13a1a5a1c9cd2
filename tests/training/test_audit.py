"""The provider fidelity audit: its statistics on hand-made and simulated scores, its false-alarm rate, an honest
test on tiny models (two providers sampling the target, one a degraded copy), and routing around a suspect."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import yaml

from eagledata.errors import InputError
from eagledata.training.audit import AuditPolicy, audit, plot_audit, sample_outliers, t_quantile, t_two_sided_p
from eagledata.training.scoring import HIST_EDGES, SampleScore, ScoreRow

T1 = '{"temperature":1.0}'


def row(i, provider, n, nll_sum, *, dataset="D", sampling=T1, sumsq=None):
    sumsq = (nll_sum ** 2 / n if n else 0.0) if sumsq is None else sumsq
    return ScoreRow(f"{provider}-{dataset}-{i}", dataset, provider, sampling,
                    SampleScore(n, float(nll_sum), float(sumsq), float(nll_sum), (0,) * len(HIST_EDGES)))


def simulated(rng, provider, count, *, dataset="D", sampling=T1, mean=1.0, shift=0.0, spread=0.5, start=0):
    """Faithful-looking rows: lengths from 5 to ~2000 tokens, each prompt with its own difficulty (mean NLL drawn
    from a gamma around `mean`), tokens exponential around it, so tokens within a sample are correlated."""
    rows = []
    for i in range(count):
        n = int(np.clip(rng.lognormal(4.5, 1.0), 5, 2000))
        mu = rng.gamma(1 / spread ** 2, mean * spread ** 2) + shift
        nll = rng.exponential(mu, n)
        rows.append(ScoreRow(f"{provider}-{dataset}-{start + i}", dataset, provider, sampling,
                             SampleScore(n, float(nll.sum()), float((nll ** 2).sum()), float(nll.max()),
                                         (0,) * len(HIST_EDGES))))
    return rows


def binomial_sf(k, n, p):
    """P(X >= k) for X ~ Binomial(n, p), exactly."""
    return sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1))


# -- the statistics on rows computed by hand --------------------------------------------------------------
def test_exact_figures_of_a_hand_computed_case():
    """A: (2 tokens, 2 nats), (2, 4) -> mean 1.5, residuals S - 1.5 n = -1, +1, V = 2/1 * 2 / 4^2 = 0.25.
    B: (1, 0.5), (3, 3.5) -> mean 1.0, residuals -0.5, +0.5, V = 2 * 0.5 / 16 = 1/16.
    No token noise (sum of squares = S^2/n): each side has 1 df (two samples), the difference's Satterthwaite
    df = 0.3125^2 / (0.25^2 + 0.0625^2). A - B = 0.5 with variance 0.3125: z = 0.894; Holm over two doubles p.
    A's 99 % CI with 1 df: 1.5 +- tan(0.495 pi) * 0.5 (the Cauchy quantile)."""
    rows = [row(0, "A", 2, 2), row(1, "A", 2, 4), row(0, "B", 1, 0.5), row(1, "B", 3, 3.5)]
    report = audit(rows, AuditPolicy(min_provider_samples=2))
    a, b = report.provider("A"), report.provider("B")
    assert (a.samples, a.tokens, a.mean_nll) == (2, 4, 1.5) and (b.samples, b.tokens, b.mean_nll) == (2, 4, 1.0)
    cauchy = math.tan(0.495 * math.pi)
    assert a.ci_low == pytest.approx(1.5 - cauchy * 0.5) and a.ci_high == pytest.approx(1.5 + cauchy * 0.5)
    assert b.ci_low == pytest.approx(1.0 - cauchy * 0.25)
    assert a.diff == pytest.approx(0.5) and b.diff == pytest.approx(-0.5) and a.reference_nll == pytest.approx(1.0)
    assert a.se == pytest.approx(math.sqrt(0.3125)) and a.z == pytest.approx(0.5 / math.sqrt(0.3125))
    assert a.df == pytest.approx(0.3125 ** 2 / (0.25 ** 2 + 0.0625 ** 2))
    assert a.p == pytest.approx(t_two_sided_p(a.z, a.df)) and a.p > math.erfc(a.z / math.sqrt(2))
    assert a.p_adjusted == pytest.approx(2 * a.p) and b.p_adjusted == pytest.approx(2 * a.p)
    assert report.suspects == [] and report.pooled_mean_nll == pytest.approx(10 / 8)
    assert "no significant difference" in a.evidence and "z = 0.89" in a.evidence


def test_student_t_tails_and_quantiles_match_closed_forms():
    """1 df is Cauchy: P(|T| > t) = 1 - 2 atan(t) / pi; 2 df: 1 - t / sqrt(2 + t^2); many df: the normal."""
    for t in (0.1, 1.0, 3.0, 30.0):
        assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, rel=1e-10)
        assert t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-10)
        assert t_two_sided_p(t / 10, 1e6) == pytest.approx(math.erfc(t / 10 / math.sqrt(2)), rel=1e-4)
    for level, df in [(0.99, 1), (0.99, 2), (0.95, 7.5), (0.99, 300)]:
        assert t_two_sided_p(t_quantile(level, df), df) == pytest.approx(1 - level, rel=1e-9)
    assert t_quantile(0.99, 2) == pytest.approx(math.sqrt(2 * 0.99 ** 2 / (1 - 0.99 ** 2)))


def test_the_ci_covers_the_true_mean_at_its_level():
    """400 simulated providers of 60 samples whose true token-weighted mean is 1.0 (difficulty independent of
    length), CIs at 90 % (significance 0.1, so that too wide fails as well as too narrow): the misses lie within
    what Binomial(400, 0.1) allows both ways at the 0.001 level (22..61). Tokens within a sample are strongly
    correlated here: a per-token variance (tokens taken as independent) misses in about 85 % of these trials."""
    rng = np.random.default_rng(7)
    trials, misses = 400, 0
    for _t in range(trials):
        rows = simulated(rng, "A", 60) + simulated(rng, "B", 5)
        a = audit(rows, AuditPolicy(min_provider_samples=2, significance=0.1)).provider("A")
        misses += not a.ci_low <= 1.0 <= a.ci_high
    low = next(k for k in range(trials) if binomial_sf(k, trials, 0.1) < 1 - 5e-4) - 1
    top = next(k for k in range(trials) if binomial_sf(k + 1, trials, 0.1) < 5e-4)
    print(f"90 % CI missed the true mean in {misses}/{trials} ({low}..{top})")
    assert low <= misses <= top


def test_a_provider_serving_only_a_harder_dataset_is_not_flagged_for_it():
    rng = np.random.default_rng(1)
    rows = (simulated(rng, "A", 80, dataset="easy", mean=0.8) + simulated(rng, "A", 80, dataset="hard", mean=2.0)
            + simulated(rng, "B", 80, dataset="easy", mean=0.8) + simulated(rng, "B", 80, dataset="hard", mean=2.0)
            + simulated(rng, "H", 120, dataset="hard", mean=2.0))
    report = audit(rows)
    h = report.provider("H")
    assert h.mean_nll > report.provider("A").mean_nll + 0.5  # much higher in raw terms ...
    assert h.verdict == "consistent" and h.strata == 1 and abs(h.diff) < 0.2  # ... but like the others on "hard"
    assert report.suspects == []
    # the same provider with a real shift on that dataset is found: the consistency above is not for lack of power
    shifted = [r for r in rows if r.provider != "H"] + simulated(rng, "H", 120, dataset="hard", mean=2.0, shift=1.0)
    assert audit(shifted).suspects == ["H"]


def test_sampling_settings_are_never_pooled():
    """A provider alone at temperature 0.6 has a lower NLL, yet no one to be compared with: consistent, and it
    says so; were sampling ignored, it would be flagged."""
    rng = np.random.default_rng(2)
    cold = '{"temperature":0.6}'
    rows = simulated(rng, "A", 60) + simulated(rng, "B", 60) + simulated(rng, "C", 60, sampling=cold, mean=0.5)
    c = audit(rows).provider("C")
    assert c.verdict == "consistent" and not c.tested and c.evidence.startswith("no other provider to compare with")
    assert math.isnan(c.z) and math.isfinite(c.ci_low)
    assert audit([replace(r, sampling=T1) for r in rows]).suspects == ["C"]


def test_one_bad_provider_does_not_drag_the_faithful_ones():
    """C's shift lowers A's and B's reference at the first step; Holm's step-down takes C out of it before
    A and B are judged, so they are compared with each other only."""
    rng = np.random.default_rng(3)
    rows = simulated(rng, "A", 150) + simulated(rng, "B", 150) + simulated(rng, "C", 150, shift=0.5)
    report = audit(rows)
    assert report.suspects == ["C"]
    c, a = report.provider("C"), report.provider("A")
    assert c.z > 5 and "higher" in c.evidence and f"z = {c.z:.2f}" in c.evidence
    assert a.verdict == "consistent" and "not found suspect" in a.evidence and abs(a.z) < 3
    assert report.exclusions()["C"].startswith("fidelity audit: mean NLL under the verifier higher")


def test_with_two_providers_only_the_higher_one_is_flagged():
    """Two providers that differ cannot say which one is right; the audit flags the one with the higher NLL
    (a different model normally scores higher: KL >= 0) and says the other could not be tested on its own."""
    rng = np.random.default_rng(4)
    report = audit(simulated(rng, "A", 150) + simulated(rng, "B", 150, shift=0.5))
    assert report.suspects == ["B"]
    assert "only comparison was with providers found suspect (B)" in report.provider("A").evidence


def test_few_samples_are_not_tested():
    rng = np.random.default_rng(5)
    report = audit(simulated(rng, "A", 40) + simulated(rng, "B", 40) + simulated(rng, "C", 4, shift=3.0))
    c = report.provider("C")
    assert c.verdict == "consistent" and not c.tested
    assert c.evidence.startswith("not tested: 4 comparable samples, 10 needed")


def test_a_set_too_small_to_test_still_reports(tmp_path):
    """The demo's set: a sample or two per provider. Nothing is tested, every verdict says why, nothing breaks."""
    import matplotlib

    matplotlib.use("Agg")
    report = audit([row(0, "A", 5, 4.0), row(0, "B", 7, 6.0), row(1, "B", 3, 4.0), row(0, "", 4, 2.0)])
    assert [p.provider for p in report.providers] == ["(unknown)", "A", "B"]
    assert all(not p.tested and p.verdict == "consistent" for p in report.providers)
    assert report.provider("A").evidence.startswith("not tested: 0 comparable samples, 10 needed (of its 1 in strata")
    assert report.provider("B").evidence.startswith("not tested: 2 comparable samples")
    assert report.to_publish()["providers"]["A"]["ci_low"] is None  # one sample: no variance
    plot_audit(report)


def test_bad_inputs_are_refused():
    with pytest.raises(InputError, match="no scored samples"):
        audit([row(0, "A", 0, 0.0)])
    with pytest.raises(InputError, match="significance"):
        AuditPolicy(significance=1.5)


# -- the false-alarm rate ------------------------------------------------------------------------------
def test_false_alarm_rate_under_random_relabelling_matches_the_significance():
    """One pool of 800 faithful samples over two datasets, relabelled at random into four providers with shares
    10/20/30/40 %, 400 times. Family-wise: trials with any suspect must be at most what Binomial(400, 0.01)
    exceeds with probability < 0.001 (k <= 11). Calibration: the smallest provider P0's raw p < 0.1 in a share that
    Binomial(400, 0.1) allows both ways at the 0.001 level (22..61); a variance that is too large (a test that
    never fires) fails that as surely as a too-small one fails the first."""
    rng = np.random.default_rng(11)
    pool = (simulated(rng, "x", 400, dataset="easy", mean=0.8) + simulated(rng, "x", 400, dataset="hard", mean=2.0,
                                                                          start=400))
    names = ["P0", "P1", "P2", "P3"]
    trials, alarms, small_p = 400, 0, 0
    for _t in range(trials):
        labels = rng.choice(len(names), len(pool), p=[0.1, 0.2, 0.3, 0.4])
        report = audit([replace(r, provider=names[k]) for r, k in zip(pool, labels)])
        alarms += bool(report.suspects)
        small_p += report.provider("P0").p < 0.1
    high = next(k for k in range(trials) if binomial_sf(k + 1, trials, 0.01) < 1e-3)
    low = next(k for k in range(trials) if binomial_sf(k, trials, 0.1) < 1 - 5e-4) - 1
    top = next(k for k in range(trials) if binomial_sf(k + 1, trials, 0.1) < 5e-4)
    print(f"false alarms {alarms}/{trials} (bound {high}); P0 raw p < 0.1: {small_p}/{trials} ({low}..{top})")
    assert alarms <= high
    assert low <= small_p <= top


# -- outliers ------------------------------------------------------------------------------------------
def test_a_junk_sample_is_an_outlier_and_long_hard_prompts_are_not():
    rng = np.random.default_rng(6)
    rows = simulated(rng, "A", 100) + simulated(rng, "B", 100, shift=1.0)  # B shifted as a whole
    junk = ScoreRow("junk", "D", "B", T1, SampleScore(300, 300 * 9.0, 300 * 85.0, 14.0, (0,) * len(HIST_EDGES)))
    found = sample_outliers(rows + [junk])
    assert [o.id for o in found] == ["junk"]
    o = found[0]
    assert (o.provider, o.dataset, o.tokens, o.mean_nll) == ("B", "D", 300, 9.0) and o.score > 6
    report = audit(rows + [junk])
    assert report.to_publish()["outliers"] == ["junk"]
    assert list(report.outlier_table().columns[:5]) == ["id", "provider", "dataset", "sampling", "tokens"]


def junk_rows(provider, count, *, tokens=300, nll=9.0):
    return [ScoreRow(f"{provider}-junk-{i}", "D", provider, T1,
                     SampleScore(tokens, tokens * nll, tokens * (nll * nll + 4.0), 14.0, (0,) * len(HIST_EDGES)))
            for i in range(count)]


def test_a_provider_serving_many_junk_samples_does_not_escape_by_their_being_left_out():
    """C's bulk is faithful, so with its outliers left out the NLL test finds nothing; but 10 of its 70 samples
    are junk against none of A's and B's: its outlier share is the finding. A's one junk sample is not."""
    rng = np.random.default_rng(12)
    rows = (simulated(rng, "A", 60) + junk_rows("A", 1) + simulated(rng, "B", 60) + simulated(rng, "C", 60)
            + junk_rows("C", 10))
    report = audit(rows)
    c, a = report.provider("C"), report.provider("A")
    assert (c.outliers, c.judged_samples, a.outliers) == (10, 70, 1)
    assert c.tested and c.p_adjusted > 0.01  # the bulk of its samples is like the others' ...
    assert c.verdict == "suspect" and report.suspects == ["C"]  # ... its share of junk is not
    assert "outlier share far above the others': 10 of its 70 judged samples against 1 of 121" in c.evidence
    assert a.verdict == "consistent" and a.outlier_share_p == 1.0
    assert report.exclusions()["C"].startswith("fidelity audit: ")
    assert set(report.to_exclude().ids) == {r.id for r in rows if "junk" in r.id}
    # the exact test's figure: P(X >= 10) drawing C's 70 judged samples from 191 with 11 outliers, Holm over 3
    tail = sum(math.comb(11, k) * math.comb(180, 70 - k) for k in range(10, 12)) / math.comb(191, 70)
    assert c.outlier_share_p == pytest.approx(min(1.0, 3 * tail), rel=1e-9)


def test_the_outlier_share_test_is_holm_over_exact_tails():
    from eagledata.training.audit import holm, outlier_share_tests

    got = outlier_share_tests({"A": 6, "B": 0, "C": 0}, {"A": 60, "B": 60, "C": 60})
    assert got["A"] == pytest.approx(3 * math.comb(60, 6) / math.comb(180, 6), rel=1e-9)  # all 6 fell in A
    assert got["B"] == got["C"] == 1.0
    assert outlier_share_tests({"A": 1}, {"A": 60, "B": 60, "C": 60})["A"] == 1.0  # 1/3 raw, x3
    assert outlier_share_tests({}, {"A": 60, "B": 60}) == {"A": 1.0, "B": 1.0}  # no outliers at all
    assert outlier_share_tests({"A": 3}, {"A": 60}) == {}  # nobody to compare with
    assert holm({"x": 0.01, "y": 0.04, "z": 0.03}) == pytest.approx({"x": 0.03, "y": 0.06, "z": 0.06})


# -- the report's forms ---------------------------------------------------------------------------------
def test_publish_table_and_plot():
    import json

    import matplotlib

    matplotlib.use("Agg")
    rng = np.random.default_rng(8)
    report = audit(simulated(rng, "A", 100) + simulated(rng, "B", 100) + simulated(rng, "C", 100, shift=0.5)
                   + simulated(rng, "solo", 30, dataset="other"))
    doc = json.loads(json.dumps(report.to_publish(), allow_nan=False))  # plain JSON, no NaN
    assert doc["significance"] == 0.01 and set(doc["providers"]) == {"A", "B", "C", "solo"}
    for p in doc["providers"].values():
        assert {"samples", "tokens", "mean_nll", "ci_low", "ci_high", "verdict"} <= set(p)
        assert p["verdict"] in ("consistent", "suspect")
    assert doc["providers"]["solo"]["z"] is None and doc["suspects"] == ["C"]
    table = report.table()
    assert list(table.index) == ["A", "B", "C", "solo"]
    assert {"diff", "z", "p", "p_adjusted", "verdict", "evidence"} <= set(table.columns)
    ax = plot_audit(report)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["A", "B", "C", "solo"]
    assert [t.get_text() for t in ax.texts] == ["suspect"]


# -- routing around a suspect ------------------------------------------------------------------------------
def emulator_decision(tmp_path):
    """The emulator's catalog as its /endpoints route lists it (display name + `slug/quantization` tag), decided
    by the default policy and saved where generation reads it."""
    from eagledata.emulator.catalog import default_endpoints
    from eagledata.openrouter import Catalog, PrecisionPolicy, decide

    listing = [{"provider_name": e.provider, "tag": e.tag, "quantization": e.quantization,
                "pricing": {"prompt": str(e.price_prompt), "completion": str(e.price_completion)},
                "status": e.status, "supported_parameters": list(e.supported_parameters)} for e in default_endpoints()]
    cat = Catalog("moonshotai/kimi-k2.5", "emulator", "now", listing)
    return decide(cat.model, cat.normalized(), PrecisionPolicy.for_model(cat.model)).save(tmp_path / "params")


def test_a_suspect_is_ignored_in_routing_with_its_evidence(tmp_path):
    from eagledata.emulator.catalog import default_endpoints, route
    from eagledata.emulator.requests import parse_provider
    from eagledata.openrouter import RoutingDecision, ignore_in_routing

    path = emulator_decision(tmp_path)
    before = RoutingDecision.load(path)
    assert route(default_endpoints(), parse_provider(before.provider)).endpoints[0].provider == "Chutes"  # cheapest
    rng = np.random.default_rng(9)
    report = audit(simulated(rng, "Chutes", 120, shift=0.5) + simulated(rng, "DeepInfra", 120)
                   + simulated(rng, "Moonshot AI", 120))
    assert report.suspects == ["Chutes"]

    after = ignore_in_routing(report, path)
    loaded = RoutingDecision.load(path)
    assert loaded == after
    assert loaded.provider["ignore"] == sorted([*before.provider["ignore"], "chutes/int4"])
    assert {k: v for k, v in loaded.provider.items() if k != "ignore"} == \
        {k: v for k, v in before.provider.items() if k != "ignore"}
    chutes = [x for x in loaded.excluded if x.provider == "Chutes"]
    assert len(chutes) == 1 and chutes[0].tag == "chutes/int4" and chutes[0].quantization == "int4"
    assert chutes[0].reason == report.exclusions()["Chutes"] and "z = " in chutes[0].reason
    assert loaded.excluded[:len(before.excluded)] == before.excluded
    assert "Chutes" not in loaded.eligible_providers and len(loaded.eligible) == len(before.eligible) - 1
    # the next generation run's requests no longer reach it (the emulator routes as OpenRouter does)
    assert all(e.provider != "Chutes" for e in route(default_endpoints(), parse_provider(loaded.provider)).endpoints)
    # again: nothing more to do, the file stays as it is
    text = path.read_text()
    ignore_in_routing(report, path)
    assert path.read_text() == text and yaml.safe_load(text)["provider"]["ignore"] == loaded.provider["ignore"]


def test_routing_refuses_a_provider_it_does_not_know(tmp_path):
    from eagledata.openrouter import ignore_in_routing

    path = emulator_decision(tmp_path)
    text = path.read_text()
    with pytest.raises(InputError, match=r"kimi-k2.5.yaml field 'provider': provider 'Nobody' is not in the routing"):
        ignore_in_routing({"DeepInfra": "audit", "Nobody": "audit"}, path)
    assert path.read_text() == text  # refused before anything is written
    with pytest.raises(InputError, match="give a reason"):
        ignore_in_routing(["DeepInfra"], path)
    ignore_in_routing(["deepinfra"], path, reason="by hand")  # a name as OpenRouter reports it, any case
    assert "deepinfra/int4" in yaml.safe_load(path.read_text())["provider"]["ignore"]


# -- the honest test: providers that sample from tiny models -----------------------------------------------
def _scored(tmp_path_factory, name, build):
    """The samples `build()` makes, scored as the pipeline scores them: extraction with the target writes
    scores.jsonl (one thread: a tiny model's ops are too small for threads; on 2 busy cores they only contend)."""
    import torch

    from eagledata.training import ExtractOptions, extract
    from eagledata.training.scoring import read_scores

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target, samples = build()
        result = extract(samples, tmp_path_factory.mktemp(name), "tiny", target, progress=False,
                         options=ExtractOptions(max_tokens_per_batch=4096))
        assert result.complete
        return read_scores(result.directory)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_providers(tmp_path_factory):
    """48 prompts of 8 tokens, answered by A and B from the target (head scaled x20, temperature 1) and by C from
    a copy rounded to 3 bits; outputs cut to 16..48 tokens; plus one junk sample of A (random ids as output)."""
    from tests.helpers.audit_providers import three_providers

    return _scored(tmp_path_factory, "audit", three_providers)


def test_the_audit_finds_the_degraded_provider_among_tiny_models(tiny_providers):
    """At significance 0.01 with 48 samples (~1,500 scored tokens) per provider: C is suspect, A and B are not,
    and the junk sample is the one outlier."""
    rows = tiny_providers
    report = audit(rows)
    table = report.table()
    print(table[["samples", "tokens", "mean_nll", "diff", "z", "p_adjusted", "verdict"]].to_string())
    assert report.suspects == ["C"]
    assert report.provider("C").diff > 0 and report.provider("C").p_adjusted < 1e-3
    assert report.provider("A").tested and report.provider("B").tested
    assert report.to_publish()["outliers"] == ["A-junk"]
    assert all(table.loc[p, "samples"] == 48 for p in "BC") and table.loc["A", "samples"] == 49
    # what an export of the set then leaves out: C's samples and the junk one, with the evidence as the reason
    exclude = report.to_exclude()
    left_out = exclude.decide([r.id for r in rows], rows)
    assert set(left_out) == {r.id for r in rows if r.provider == "C"} | {"A-junk"}
    assert exclude.reason.startswith("C: fidelity audit: mean NLL under the verifier higher")
    assert "1 outlier samples" in exclude.reason
    # without the junk sample, A and B are as alike as two faithful providers should be
    clean = audit([r for r in rows if r.id != "A-junk"])
    print(clean.table()[["samples", "tokens", "mean_nll", "diff", "z", "df", "p_adjusted", "verdict"]].to_string())
    assert clean.suspects == ["C"] and abs(clean.provider("A").z) < 2 and clean.outliers == ()
    dropped = audit(rows, AuditPolicy(drop_outliers=True))  # the same, the junk still listed
    assert dropped.provider("C").z == pytest.approx(clean.provider("C").z) and dropped.outliers == report.outliers


@pytest.fixture(scope="module")
def junk_and_noise_rows(tmp_path_factory):
    """Issue 30's case: 60 prompts answered by A and B from the target and by C from a noised copy (+~33 % NLL per
    token); A's answer to one prompt is uniform random ids."""
    from tests.helpers.audit_providers import junk_and_noise

    return _scored(tmp_path_factory, "junk", junk_and_noise)


def test_one_junk_sample_neither_flags_its_provider_nor_hides_a_degraded_one(junk_and_noise_rows):
    """With the junk sample in A's mean, A's mean rose above C's and lifted C's reference: all three were called
    consistent. Outliers are left out of the tests by default: C is suspect, A and B consistent, the junk listed
    and counted for A (and one outlier among A's 60 samples is no finding about A)."""
    rows = junk_and_noise_rows
    by = {p: [r for r in rows if r.provider == p and r.id != "A-junk"] for p in "ABC"}
    mean = {p: sum(r.score.nll_sum for r in v) / sum(r.score.tokens for r in v) for p, v in by.items()}
    ratio = mean["C"] / ((mean["A"] + mean["B"]) / 2)
    print({p: round(m, 3) for p, m in mean.items()}, f"C / faithful = {ratio:.3f}")
    assert 1.2 < ratio < 1.45  # the degradation, computed without the audit: about +33 % NLL per token

    report = audit(rows)
    print(report.table()[["samples", "tokens", "mean_nll", "diff", "z", "p_adjusted", "verdict"]].to_string())
    assert {p.provider: p.verdict for p in report.providers} == {"A": "consistent", "B": "consistent",
                                                                 "C": "suspect"}
    # the junk is the most extreme outlier and A's only one; B's lowest-NLL answer (0.32 nats/token against a
    # median of 2.45, robust z -6.05) is listed too: outliers are two-sided, and it is left out like any other
    assert report.outliers[0].id == "A-junk" and report.outliers[0].provider == "A" and report.outliers[0].score > 10
    assert all(o.score < 0 for o in report.outliers[1:])
    a = report.provider("A")
    assert (a.samples, a.outliers, a.judged_samples) == (60, 1, 60) and a.tested and a.outlier_share_p == 1.0
    assert sum(p.outliers for p in report.providers) == len(report.outliers)
    assert a.mean_nll == pytest.approx(mean["A"], rel=1e-9)  # the bulk of A's samples, the junk left out
    published = report.to_publish()
    assert published["providers"]["A"]["outliers"] == 1 and published["providers"]["C"]["outliers"] == 0
    assert published["outliers"][0] == "A-junk"
    assert "1 outlier sample (listed) left out of its mean and tests" in a.evidence
    left_out = report.to_exclude().decide([r.id for r in rows], rows)
    assert set(left_out) == {r.id for r in rows if r.provider == "C"} | {o.id for o in report.outliers}
    # the old default (junk counted in its provider's tests) hides C: the case this test exists for
    assert audit(rows, AuditPolicy(drop_outliers=False)).suspects != ["C"]
