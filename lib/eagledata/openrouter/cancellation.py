"""Which endpoints stop billing when a stream is closed (pure): OpenRouter's documented lists, a user's overrides.

Closing a streaming request stops generation and billing only on providers that support stream cancellation; the
others generate and bill the whole answer whatever the client does. The endpoint listing does not say which is
which: the docs do (https://openrouter.ai/docs/api-reference/streaming, "Stream Cancellation", read 2026-12). A
provider on neither list is taken not to cancel: counting on a refund that never comes costs money, the other
mistake only time. A user who knows better (a provider's own statement, a measured refund) overrides it by name or
tag.
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Mapping

from ..errors import InputError

DOCS = "https://openrouter.ai/docs/api-reference/streaming"
# The docs' names as listed; matched on lowercase letters and digits, so "DeepInfra" is "deepinfra".
SUPPORTED = ("OpenAI", "Azure", "Anthropic", "Fireworks", "Mancer", "Recursal", "AnyScale", "Lepton", "OctoAI",
             "Novita", "DeepInfra", "Together", "Cohere", "Hyperbolic", "Infermatic", "Avian", "XAI", "Cloudflare",
             "SFCompute", "Nineteen", "Liquid", "Friendli", "Chutes", "DeepSeek")
NOT_SUPPORTED = ("AWS Bedrock", "Groq", "Modal", "Google", "Google AI Studio", "Minimax", "HuggingFace", "Replicate",
                 "Perplexity", "Mistral", "AI21", "Featherless", "Lynn", "Lambda", "Reflection", "SambaNova",
                 "Inflection", "ZeroOneAI", "AionLabs", "Alibaba", "Nebius", "Kluster", "Targon", "InferenceNet")
# The endpoint listing's provider names that the docs spell otherwise.
ALIASES = {"amazonbedrock": "awsbedrock", "googlevertex": "google", "nebiusaistudio": "nebius",
           "togetherai": "together", "fireworksai": "fireworks", "novitaai": "novita", "deepseekai": "deepseek",
           "mistralai": "mistral", "cloudflareworkersai": "cloudflare", "friendliai": "friendli"}

SOURCE_SUPPORTED = "docs: supported"
SOURCE_NOT_SUPPORTED = "docs: not supported"
SOURCE_NOT_LISTED = "not in the docs' lists: taken as no"
SOURCE_OVERRIDE = "override (stream_cancellation)"


def _key(name: str) -> str:
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    return ALIASES.get(key, key)


_DOCUMENTED = {**{_key(n): False for n in NOT_SUPPORTED}, **{_key(n): True for n in SUPPORTED}}


def stream_cancellation(provider: str, tag: str = "",
                        overrides: Mapping[str, bool] | None = None) -> tuple[bool, str]:
    """Whether closing a stream on this endpoint stops its billing, and on what grounds. `overrides` is keyed by
    provider name or endpoint tag (any case); a tag's entry wins over its provider's."""
    for name in (tag, provider):
        for key, value in (overrides or {}).items():
            if name and _key(key) == _key(name):
                return bool(value), SOURCE_OVERRIDE
    documented = _DOCUMENTED.get(_key(provider))
    if documented is None:
        return False, SOURCE_NOT_LISTED
    return documented, SOURCE_SUPPORTED if documented else SOURCE_NOT_SUPPORTED


def check_overrides(overrides: Mapping[str, bool] | None, names: list[str]) -> None:
    """An override that names no endpoint (a typo) is refused, naming the closest provider or tag."""
    known = {_key(n) for n in names}
    for key, value in (overrides or {}).items():
        if not isinstance(value, bool):
            raise InputError(f"{value!r} is not true or false", field=f"stream_cancellation.{key}")
        if _key(key) not in known:
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; the endpoints: {', '.join(sorted(set(names)))}"
            raise InputError(f"{key!r} names no endpoint of the model{hint}", field="stream_cancellation")
