"""Which endpoints stop billing when a stream is closed: OpenRouter's documented lists, unknown = no, overrides."""
import pytest
import yaml

from eagledata.errors import InputError
from eagledata.openrouter import RoutingDecision
from eagledata.openrouter.cancellation import (
    SOURCE_NOT_LISTED,
    SOURCE_NOT_SUPPORTED,
    SOURCE_OVERRIDE,
    SOURCE_SUPPORTED,
    stream_cancellation,
)
from tests.helpers.catalogs import catalog, decision_for, ep


@pytest.mark.parametrize("provider, expected", [
    ("DeepInfra", (True, SOURCE_SUPPORTED)),
    ("Together", (True, SOURCE_SUPPORTED)),
    ("Chutes", (True, SOURCE_SUPPORTED)),
    ("Amazon Bedrock", (False, SOURCE_NOT_SUPPORTED)),  # the listing's name for the docs' "AWS Bedrock"
    ("Google Vertex", (False, SOURCE_NOT_SUPPORTED)),
    ("Google AI Studio", (False, SOURCE_NOT_SUPPORTED)),
    ("Nebius AI Studio", (False, SOURCE_NOT_SUPPORTED)),
    ("Groq", (False, SOURCE_NOT_SUPPORTED)),
    ("Moonshot AI", (False, SOURCE_NOT_LISTED)),  # on neither list: taken not to cancel
    ("Parasail", (False, SOURCE_NOT_LISTED)),
])
def test_the_documented_lists(provider, expected):
    assert stream_cancellation(provider) == expected


def test_overrides_by_provider_or_tag_in_any_case():
    assert stream_cancellation("Moonshot AI", "moonshotai/int4", {"moonshot ai": True}) == (True, SOURCE_OVERRIDE)
    assert stream_cancellation("DeepInfra", "deepinfra/fp8", {"DeepInfra": True, "deepinfra/fp8": False}) == \
        (False, SOURCE_OVERRIDE)  # the tag's entry wins over its provider's
    assert stream_cancellation("DeepInfra", "deepinfra/int4", {"deepinfra/fp8": False}) == (True, SOURCE_SUPPORTED)


def test_the_catalog_and_the_routing_file_say_which_endpoints_cancel(tmp_path):
    cat = catalog(ep("Parasail", "int4", 0.55, 2.6))
    table = cat.table({"Parasail": True})
    rows = {r.provider: (r.stream_cancellation, r.cancellation_source) for r in table.itertuples()}
    assert rows == {"DeepInfra": (True, SOURCE_SUPPORTED), "Moonshot AI": (False, SOURCE_NOT_LISTED),
                    "Venice": (False, SOURCE_NOT_LISTED), "Fireworks": (True, SOURCE_SUPPORTED),
                    "BaseTen": (False, SOURCE_NOT_LISTED), "Parasail": (True, SOURCE_OVERRIDE)}
    path = decision_for(cat).save(tmp_path)
    eligible = yaml.safe_load(path.read_text())["eligible"]
    assert {e["provider"]: e["stream_cancellation"] for e in eligible} == \
        {"DeepInfra": True, "Moonshot AI": False, "Venice": False, "Parasail": False}
    assert {e.provider: e.cancellation_source for e in RoutingDecision.load(path).eligible}["DeepInfra"] == \
        SOURCE_SUPPORTED


def test_an_override_that_names_no_endpoint_is_refused():
    with pytest.raises(InputError, match=r"^field 'stream_cancellation': 'Moonshot' names no endpoint of the model "
                                         r"\(did you mean 'Moonshot AI'\?\)$"):
        catalog().normalized({"Moonshot": True})
    with pytest.raises(InputError, match=r"^field 'stream_cancellation\.DeepInfra': 'yes' is not true or false$"):
        catalog().normalized({"DeepInfra": "yes"})


def test_the_emulators_billing_agrees_with_the_docs(tokenizer_dir):
    """The emulator bills an abandoned stream by each endpoint's stream_cancellation: where the docs list a provider
    it must say what they say, or the benches would measure a refund the service does not give."""
    from eagledata.emulator.catalog import default_endpoints

    for e in default_endpoints():
        cancels, source = stream_cancellation(e.provider, e.tag)
        if source != SOURCE_NOT_LISTED:
            assert e.stream_cancellation == cancels, e.provider
        else:
            assert not e.stream_cancellation, e.provider
