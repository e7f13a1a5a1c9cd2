import pytest
import yaml

from eagledata.errors import InputError
from eagledata.openrouter import (
    Catalog,
    Endpoint,
    PrecisionPolicy,
    Price,
    RoutingDecision,
    decide,
    precision_rank,
    price_summary,
    workload_costs,
)
from eagledata.paths import routing_file
from tests.helpers.catalogs import REASONING, catalog, decision_for, ep

# Where require_tools bites, the reason says it is needed only for datasets with tools (issue 44 bug 6).
NO_TOOLS = "does not support tools (require_tools=True, needed only by datasets that declare tools)"


def test_default_picture_excludes_only_below_native_and_down():
    d = decision_for(catalog())
    assert {(e.provider, e.reason) for e in d.excluded} == {
        ("Fireworks", "quantized below native int4 (nvfp4)"),
        ("BaseTen", "down (status -2); quantized below native int4 (fp4)")}
    assert d.provider["ignore"] == ["baseten", "fireworks"]
    assert d.provider["sort"] == "price"
    assert "nvfp4" not in d.provider["quantizations"] and "fp4" not in d.provider["quantizations"]
    assert {"int4", "fp8", "bf16", "unknown"} <= set(d.provider["quantizations"])
    assert d.eligible_providers == ["DeepInfra", "Moonshot AI", "Venice"]
    assert d.provider["max_price"] == {"prompt": 0.80, "completion": 3.00}
    assert any(f["provider"] == "Venice" and "not known, kept" in f["note"] for f in d.flagged)


def test_an_endpoint_that_cannot_take_tools_is_excluded_unless_tools_are_not_required():
    no_tools = [p for p in REASONING if not p.startswith("tool")]
    d = decision_for(catalog(ep("Chutes", "int4", 0.30, 1.50, params=no_tools)))
    assert ("Chutes", NO_TOOLS) in {(e.provider, e.reason) for e in d.excluded}
    assert "chutes" in d.provider["ignore"]
    kept = decision_for(catalog(ep("Chutes", "int4", 0.30, 1.50, params=no_tools)), require_tools=False)
    assert "Chutes" in kept.eligible_providers


def test_new_fp4_provider_is_excluded_by_its_listing():
    d = decision_for(catalog(ep("NewCloud", "fp4", 0.1, 0.5), ep("OddCloud", "mxfp4", 0.1, 0.5),
                             ep("WeirdCloud", "fp4_e2m1", 0.1, 0.5)))
    assert {"NewCloud", "OddCloud", "WeirdCloud"} <= {e.provider for e in d.excluded}


def test_unknown_policy_exclude_and_no_reasoning():
    d = decision_for(catalog(ep("NoThink", "fp8", 0.3, 1.0, params=["max_tokens", "tools"])), unknown="exclude")
    reasons = {e.provider: e.reason for e in d.excluded}
    assert reasons["Venice"] == "quantization 'unknown' not known (unknown_policy=exclude)"
    assert reasons["NoThink"] == "does not support reasoning"
    assert "unknown" not in d.provider["quantizations"]


def test_precision_rank_orders_formats():
    assert precision_rank("fp4") < precision_rank("int4") < precision_rank("fp8") < precision_rank("bf16")
    assert precision_rank("int3") < precision_rank("int4")
    assert precision_rank("weird") is None


def test_bad_policy_inputs():
    with pytest.raises(InputError, match="field 'native_precision'"):
        PrecisionPolicy.for_model("someone/unknown-model")
    with pytest.raises(InputError, match="field 'native_precision'"):
        PrecisionPolicy(native="int5")
    with pytest.raises(InputError, match="field 'unknown_policy'"):
        PrecisionPolicy(unknown="maybe")


def test_missing_price_is_flagged_not_fatal():
    cat = catalog(ep("Cheapskate", "int8", None, None))
    e = Endpoint.from_listing(cat.endpoints[-1])
    assert e.prompt_per_m is None and not e.priced and e.notes == "price missing"
    d = decision_for(cat)
    assert {"provider": "Cheapskate", "note": "price missing"} in d.flagged
    costs = workload_costs(cat.table(), d, 1e6, 1e6)
    assert "Cheapskate" not in set(costs["provider"])
    assert "max_price" not in d.provider  # an unpriced eligible endpoint: no server-side price cap


def test_pricing_premium():
    cat = catalog()
    d = decision_for(cat)
    costs = workload_costs(cat.table(), d, prompt_tokens=10e6, output_tokens=7e6)
    s = price_summary(costs)
    assert s.cheapest_eligible == "DeepInfra" and s.cheapest_eligible_completion_per_m == pytest.approx(2.20)
    assert s.cheapest_eligible_usd == pytest.approx(0.45 * 10 + 2.20 * 7)
    assert s.cheapest_any == "Fireworks" and s.premium_usd == pytest.approx(19.9 - (0.40 * 10 + 2.00 * 7))
    assert d.worst_price() == Price(0.80, 3.00)
    assert d.cheapest().provider == "DeepInfra"


def test_decision_roundtrips_through_yaml(tmp_path):
    d = decision_for(catalog())
    path = d.save(tmp_path)
    assert path == routing_file("moonshotai/kimi-k2.5", tmp_path) and path.name == "kimi-k2.5.yaml"
    raw = yaml.safe_load(path.read_text())
    assert raw["provider"] == d.provider
    assert {"provider": "Fireworks", "tag": "fireworks", "quantization": "nvfp4",
            "reason": "quantized below native int4 (nvfp4)"} in raw["excluded"]
    assert raw["flagged"] == [
        {"provider": "Venice", "note": "quantization 'unknown' not known, kept by unknown_policy=keep"}]
    loaded = RoutingDecision.load(path)
    assert loaded.to_dict() == d.to_dict()  # the file keeps each eligible endpoint's name, quantization and prices
    assert loaded.worst_price() == d.worst_price() and loaded.cheapest().provider == d.cheapest().provider


def test_snapshot_roundtrip_and_errors(tmp_path):
    cat = catalog()
    path = cat.save(tmp_path / "snap.json")
    loaded = Catalog.load(path, "moonshotai/kimi-k2.5")
    assert (loaded.endpoints, loaded.fetched_at) == (cat.endpoints, cat.fetched_at)
    assert loaded.source == f"snapshot {path} (from test)"
    with pytest.raises(InputError, match="field 'model'"):
        Catalog.load(path, "moonshotai/kimi-k2.6")
    (tmp_path / "bad.json").write_text('{"model": "x"}')
    with pytest.raises(InputError, match=r"bad\.json.*field 'endpoints'"):
        Catalog.load(tmp_path / "bad.json")


def test_emulator_catalog_decision_and_new_fp4_provider(tokenizer_dir):
    from eagledata.emulator import run_emulator
    from eagledata.openrouter import fetch_catalog

    newcomer = {"provider": "NewCloud", "slug": "newcloud", "quantization": "fp4", "prompt_price": 0.2,
                "completion_price": 1.0}
    with run_emulator(speed=0) as emu:
        cat = fetch_catalog(emu.base_url, "moonshotai/kimi-k2.5")
        d = decide(cat.model, cat.normalized(), PrecisionPolicy.for_model(cat.model))
        assert {e.provider for e in d.excluded} == {"Fireworks", "BaseTen", "AtlasCloud"}
        assert {e.provider: e.reason for e in d.excluded}["AtlasCloud"] == NO_TOOLS
        assert len(d.eligible) == len(cat.endpoints) - 3
        emu.reset({"endpoints": [newcomer]})
        cat2 = fetch_catalog(emu.base_url, "moonshotai/kimi-k2.5")
        d2 = decide(cat2.model, cat2.normalized(), PrecisionPolicy.for_model(cat2.model))
        assert {e.provider for e in d2.excluded} == {"Fireworks", "BaseTen", "AtlasCloud", "NewCloud"}
        with pytest.raises(InputError, match="unknown model 'moonshotai/kimi-k9'"):
            fetch_catalog(emu.base_url, "moonshotai/kimi-k9")


def test_the_providers_plot_labels_never_overlap():
    """The emulator's catalog puts Venice/Together, Novita/Moonshot AI and Chutes/DeepInfra on nearly one point."""
    import matplotlib

    matplotlib.use("Agg")
    from eagledata.emulator.catalog import default_endpoints
    from eagledata.openrouter import plot_providers

    eps = [ep(e.provider, e.quantization, e.prompt_price, e.completion_price, status=e.status, uptime=e.uptime,
              tps=e.throughput) for e in default_endpoints()]
    cat = Catalog("moonshotai/kimi-k2.5", "test", "now", eps)
    fig = plot_providers(cat.table(), decision_for(cat))
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        texts = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts if t.get_text()}  # not leader lines
        assert set(texts) == {e.provider for e in default_endpoints()}
        overlapping = [(a, b) for a in texts for b in texts if a < b and texts[a].overlaps(texts[b])]
        assert overlapping == []
        frame = ax.get_window_extent(renderer)
        assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1
                   for b in texts.values())
        legend = ax.get_legend()
        if legend is not None:
            box = legend.get_window_extent(renderer)
            assert not [name for name, b in texts.items() if b.overlaps(box)]


def test_every_endpoint_excluded_is_refused_naming_each_rule_and_its_setting(tmp_path):
    """Issue 44 bug 6: a decision with no eligible endpoint was written (its provider object ignoring every
    endpoint), and the notebook failed later in its pricing cell with "no eligible endpoint has a price"."""
    chat_only = ["reasoning", "include_reasoning", "max_tokens"]
    cat = Catalog("moonshotai/kimi-k2.5", "test", "now", [
        ep("DeepInfra", "int4", 0.45, 2.20, params=chat_only), ep("Moonshot AI", "int4", 0.60, 2.50, params=chat_only),
        ep("Fireworks", "nvfp4", 0.40, 2.00), ep("BaseTen", "fp4", 0.45, 2.10, status=-2, params=chat_only)])
    d = decision_for(cat)
    assert d.eligible == [] and {e.provider: e.reason for e in d.excluded}["DeepInfra"] == NO_TOOLS
    path = routing_file(cat.model, tmp_path)
    with pytest.raises(InputError) as e:
        d.save(tmp_path)
    assert str(e.value) == (
        f"every endpoint of moonshotai/kimi-k2.5 is excluded (4 listed, none eligible), so there is nothing to route "
        f"to and no routing decision was written to {path}: 3 endpoints (DeepInfra, Moonshot AI, BaseTen) do not "
        f"list `tools` among their supported parameters (require_tools=True: only datasets that declare tools need "
        f"them, and OpenRouter sends a request with tools only to endpoints that take them: set require_tools=False "
        f"for a run without tools); 2 (Fireworks, BaseTen) are quantized below the native int4 (the precision "
        f"policy: not the model as released); 1 (BaseTen) is down (status -2 or below; no setting changes it, try "
        f"later). Each endpoint's reasons are in the exclusion table.")
    assert not path.exists()
    kept = decision_for(cat, require_tools=False)  # the way out the message names
    assert kept.eligible_providers == ["DeepInfra", "Moonshot AI"] and kept.save(tmp_path) == path
    with pytest.raises(InputError, match=r"kimi-k2\.5\.yaml \(the one already there is left as it was: generate and "
                                         r"budget would still read it\): 3 endpoints"):
        d.save(tmp_path)
    assert RoutingDecision.load(path).eligible_providers == ["DeepInfra", "Moonshot AI"]
    nothing = decide(cat.model, [], PrecisionPolicy.for_model(cat.model), source="snapshot x.json")
    with pytest.raises(InputError, match=r"^the listing \(snapshot x\.json\) has no endpoint of moonshotai/kimi-k2\.5"):
        nothing.write(tmp_path / "r.yaml")


@pytest.mark.parametrize("kw, params, quant, rule", [
    (dict(), ["max_tokens", "tools"], "int4",
     "1 endpoint (X) does not list `reasoning` or `include_reasoning` among its supported parameters "
     "(require_reasoning=True: answers without reasoning are not the model's training data)"),
    (dict(unknown="exclude"), REASONING, "unknown",
     "1 endpoint (X) has an unknown quantization (unknown_policy=exclude; keep takes such endpoints, flagged)"),
])
def test_the_other_rules_are_named_with_their_setting(kw, params, quant, rule):
    d = decision_for(Catalog("moonshotai/kimi-k2.5", "test", "now", [ep("X", quant, 0.5, 2.0, params=params)]), **kw)
    with pytest.raises(InputError, match="is excluded") as e:
        d.save("unused")
    assert f": {rule}. Each endpoint" in str(e.value)
