"""The routing file and max_tokens judged before the first request (issue 44, bug 1): the provider object against
what OpenRouter's provider routing accepts and the endpoints the decision lists, max_tokens against the eligible
endpoints' context and max_completion_tokens. Each mistake is an InputError naming the file, its line and the
field."""
import logging

import pytest
import yaml

from eagledata.errors import InputError
from eagledata.openrouter import Endpoint, RoutingDecision
from eagledata.openrouter.routing import Exclusion, provider_problem


def ep(provider: str, tag: str, *, context: int | None = 262_144, out: int | None = 65_536) -> Endpoint:
    return Endpoint(provider=provider, tag=tag, quantization="int4", prompt_per_m=0.5, completion_per_m=2.0,
                    context_length=context, max_completion_tokens=out)


def decision(provider: dict, *eligible: Endpoint) -> RoutingDecision:
    return RoutingDecision(model="moonshotai/kimi-k2.5", provider=provider,
                           eligible=list(eligible) or [ep("DeepInfra", "deepinfra/int4"), ep("Chutes", "chutes/int4")],
                           excluded=[Exclusion("Fireworks", "fireworks/nvfp4", "nvfp4", "quantized below native")])


def problem(provider: dict, *eligible: Endpoint) -> tuple[str, str] | None:
    d = decision(provider, *eligible)
    return provider_problem(d.provider, d.eligible, d.excluded, d.model)


@pytest.mark.parametrize("provider", [
    {"ignore": ["fireworks/nvfp4"], "quantizations": ["int4", "fp8", "unknown"], "sort": "price",
     "allow_fallbacks": True, "max_price": {"prompt": 0.6, "completion": 2.5}},
    {"only": ["DeepInfra", "chutes"], "order": ["chutes/int4"], "sort": {"by": "throughput"}},
    {"sort": "latency", "require_parameters": False, "data_collection": "deny", "zdr": False,
     "preferred_min_throughput": 20, "preferred_max_latency": {"p90": 3}},
    {"ignore": ["Fireworks"]},  # an excluded endpoint's provider is still one the listing has
    {},
])
def test_what_openrouter_accepts_passes(provider):
    assert problem(provider) is None


@pytest.mark.parametrize("provider, field, says", [
    ({"ignor": ["fireworks"]}, "ignor", "not a field of OpenRouter's provider object; did you mean 'ignore'?"),
    ({"sorting": "price"}, "sorting", "did you mean 'sort'?"),
    ({"sort": "cheapest"}, "sort", "'cheapest' is not one of price, throughput, latency"),
    ({"sort": {"by": "fast"}}, "sort.by", "'fast' is not one of price, throughput, latency"),
    ({"only": ["nosuch"]}, "only[0]", "'nosuch' is no endpoint of moonshotai/kimi-k2.5 (the decision lists "
                                      "Chutes, DeepInfra, Fireworks)"),
    ({"order": ["deepinfra", "nosuch"]}, "order[1]", "'nosuch' is no endpoint"),
    ({"ignore": ["chute"]}, "ignore[0]", "'chute' is no endpoint"),
    ({"only": "deepinfra"}, "only", "must be a list of provider slugs"),
    ({"only": ["fireworks"]}, "only", "leaves no eligible endpoint (fireworks/nvfp4 is excluded: quantized below"),
    ({"only": ["deepinfra"], "ignore": ["deepinfra"]}, "only", "leaves no eligible endpoint"),
    ({"quantizations": ["int5"]}, "quantizations[0]", "'int5' is not a quantization OpenRouter lists"),
    ({"allow_fallbacks": "yes"}, "allow_fallbacks", "must be true or false"),
    ({"data_collection": "never"}, "data_collection", "'never' is not one of allow, deny"),
    ({"max_price": {"completion": "cheap"}}, "max_price.completion", "must be a number >= 0"),
    ({"max_price": {"completions": 2}}, "max_price.completions", "not a field of max_price"),
])
def test_each_mistake_is_named_with_its_field(provider, field, says):
    got = problem(provider)
    assert got is not None and got[0] == field and says in got[1], got


def test_a_routing_file_mistake_names_the_file_and_line(tmp_path):
    path = decision({"ignore": ["fireworks/nvfp4"], "sort": "price"}).write(tmp_path / "kimi-k2.5.yaml")
    text = path.read_text()
    path.write_text(text.replace("  sort: price\n", "  sort: cheapest\n"))
    line = next(i for i, s in enumerate(path.read_text().splitlines(), 1) if "sort: cheapest" in s)
    with pytest.raises(InputError, match=rf"{path}:{line} field 'provider.sort': 'cheapest' is not one of"):
        RoutingDecision.load(path)
    path.write_text(text.replace("provider:\n", "provider:\n  only:\n  - deepinfra\n  - nosuch\n"))
    line = next(i for i, s in enumerate(path.read_text().splitlines(), 1) if "- nosuch" in s)
    with pytest.raises(InputError, match=rf"{path}:{line} field 'provider.only': 'nosuch' is no endpoint"):
        RoutingDecision.load(path)


def test_the_routing_file_keeps_the_limits_max_tokens_is_checked_against(tmp_path):
    d = decision({"sort": "price"}, ep("DeepInfra", "deepinfra/int4", out=32_768))
    loaded = RoutingDecision.load(d.write(tmp_path / "r.yaml"))
    assert [(e.context_length, e.max_completion_tokens) for e in loaded.eligible] == [(262_144, 32_768)]
    assert yaml.safe_load((tmp_path / "r.yaml").read_text())["eligible"][0]["max_completion_tokens"] == 32_768


def test_max_tokens_that_no_eligible_endpoint_serves_is_refused():
    d = decision({}, ep("A", "a/int4", context=131_072, out=32_768), ep("B", "b/int4", context=262_144, out=65_536))
    d.check_max_tokens(65_536)
    with pytest.raises(InputError, match=r"field 'max_tokens': 70000 is more than any eligible endpoint answers "
                                         r"\(max_completion_tokens: 65,536 at most, B\)"):
        d.check_max_tokens(70_000)
    wide = decision({}, ep("A", "a/int4", context=131_072, out=None), ep("B", "b/int4", context=262_144, out=None))
    with pytest.raises(InputError, match=r"300000 leaves no room for a prompt in any eligible endpoint's context "
                                         r"\(262,144 tokens at most, B\)"):
        wide.check_max_tokens(300_000)


def test_max_tokens_that_leaves_some_endpoints_out_says_which(caplog):
    d = decision({}, ep("A", "a/int4", out=32_768), ep("B", "b/int4", out=65_536))
    with caplog.at_level(logging.WARNING, logger="eagledata"):
        d.check_max_tokens(40_000)
    assert "max_tokens 40000 leaves out A (max_completion_tokens 32,768)" in caplog.text


def test_unknown_limits_are_not_guessed():
    decision({}, ep("A", "a/int4", context=None, out=None)).check_max_tokens(10_000_000)
