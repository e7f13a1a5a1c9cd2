"""The provider catalog and OpenRouter's routing policy, as pure functions over endpoint records.

Kept free of HTTP so the routing decision a request gets can be unit-tested and explained.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from decimal import Decimal

# Endpoint status as the endpoints listing reports it: 0 is serving, negative values are degraded/down.
STATUS_OK, STATUS_DOWN = 0, -5

DEFAULT_PARAMETERS = ("max_tokens", "temperature", "top_p", "stop", "seed", "reasoning",
                      "include_reasoning", "response_format", "tools", "tool_choice")
NO_TOOLS = tuple(p for p in DEFAULT_PARAMETERS if p not in ("tools", "tool_choice"))
TOOL_CALL_IDS = ("native", "call")  # Endpoint.tool_call_ids


def per_token(usd_per_million: float) -> str:
    """USD per million tokens → USD per token as the exact decimal string OpenRouter prints."""
    d = Decimal(str(usd_per_million)) / Decimal(1_000_000)
    return format(d.normalize(), "f")


@dataclass
class Quirks:
    """Rates of real-provider answer shapes a client must cope with (drawn per response, in field order).

    The fields are the quirks: the config's `quirks:` keys, the draw (`content.generate`) and the stats all
    read them from here. How each one looks is `bodies.SERVED` (how the message fields are served) or
    `content.TEXT_QUIRKS` (what the text itself contains)."""

    reasoning_details_only: float = 0.0  # message.reasoning null, text only in reasoning_details
    inline_think: float = 0.0  # reasoning inline as <think>…</think> at the start of content
    literal_specials: float = 0.0  # the text "<|im_end|>" or "<think>" inside content
    # An engine serving K2.5 without its reasoning parser (vllm#36207): no reasoning field, content
    # "reasoning</think>answer" (no opening tag: the prompt opened it); a cut inside the reasoning is all content.
    bare_close: float = 0.0
    reasoning_dropped: float = 0.0  # reasoning billed and counted, its text served nowhere
    special_spaces: float = 0.0  # a space beside every special token (vllm#33457): " reasoning " / " answer "
    # The provider parses a call's arguments and re-dumps them compactly (`{"a":1}`, non-ASCII escaped): the served
    # string is not the model's text (usage still counts the model's ids). Drawn only for answers with calls.
    arguments_reserialized: float = 0.0


QUIRKS: tuple[str, ...] = tuple(f.name for f in fields(Quirks))


@dataclass
class Endpoint:
    """One provider's deployment of the model, with the figures the listing shows."""

    provider: str  # display name, e.g. "DeepInfra"
    slug: str  # provider slug, e.g. "deepinfra"
    quantization: str
    prompt_price: float  # USD per million tokens
    completion_price: float  # USD per million tokens
    context_length: int = 262_144
    max_completion_tokens: int = 65_536
    latency: float = 1.0  # time to first token, seconds
    throughput: float = 40.0  # output tokens per second
    uptime: float = 99.0  # uptime_last_30m, percent
    status: int = STATUS_OK
    capacity: int = 1000  # concurrent requests it takes before it is busy
    error_rate: float = 0.0  # provider errors that make OpenRouter fall back to the next endpoint
    data_collection: str = "deny"  # "allow" when the provider may retain/train on prompts
    supported_parameters: tuple[str, ...] = DEFAULT_PARAMETERS
    quirks: Quirks = field(default_factory=Quirks)
    # An aborted stream stops generation and billing (the tokens so far are billed); without it the
    # provider generates on and bills the whole answer. A non-streaming request always runs to the end.
    stream_cancellation: bool = False
    # Whether `usage.completion_tokens` counts the final `<|im_end|>` (providers differ: a constant offset of -1
    # on finished answers when not). Billing follows the count, as the service bills what it reports.
    usage_counts_im_end: bool = True
    # The id a tool call is served with: "native" the model's own `functions.NAME:IDX` (vLLM's kimi_k2 parser
    # keeps it), "call" an OpenAI-style `call_` + 24 alphanumerics the provider makes up.
    tool_call_ids: str = "native"

    @property
    def tag(self) -> str:
        return f"{self.slug}/{self.quantization}"

    @property
    def price_prompt(self) -> float:
        """USD per prompt token, the float of the listed string (so clients can recompute cost exactly)."""
        return float(per_token(self.prompt_price))

    @property
    def price_completion(self) -> float:
        return float(per_token(self.completion_price))

    @property
    def down(self) -> bool:
        return self.status < 0

    def matches(self, name: str) -> bool:
        """Provider names in only/ignore/order match display name, slug or tag, case-insensitively."""
        n = name.strip().lower()
        return n in (self.provider.lower(), self.slug.lower(), self.tag.lower())


def _ep(provider: str, slug: str, quant: str, prompt: float, completion: float, latency: float,
        throughput: float, uptime: float, **kw) -> Endpoint:
    return Endpoint(provider, slug, quant, prompt, completion, latency=latency, throughput=throughput,
                    uptime=uptime, **kw)


def default_endpoints() -> list[Endpoint]:
    """The Kimi-K2.5 picture: native int4 providers, two below-native fp4 ones (one down). Tool calls: AtlasCloud
    does not take `tools` (OpenRouter routes tool requests around it); Together and Fireworks serve `call_…` ids,
    the others the model's own."""
    return [
        _ep("Chutes", "chutes", "int4", 0.40, 2.20, 1.6, 38, 97.1, data_collection="allow",
            quirks=Quirks(inline_think=0.02), stream_cancellation=True),
        _ep("DeepInfra", "deepinfra", "int4", 0.45, 2.20, 0.9, 45, 99.6, stream_cancellation=True),
        _ep("SiliconFlow", "siliconflow", "int4", 0.55, 2.30, 2.1, 30, 98.4,
            quirks=Quirks(reasoning_details_only=0.05), usage_counts_im_end=False),
        _ep("AtlasCloud", "atlascloud", "int4", 0.50, 2.40, 1.4, 35, 98.9, supported_parameters=NO_TOOLS),
        _ep("Together", "together", "int4", 0.60, 2.80, 0.7, 60, 99.8, max_completion_tokens=32_768,
            stream_cancellation=True, tool_call_ids="call"),
        _ep("Novita", "novita", "int4", 0.55, 2.50, 1.2, 42, 99.1, quirks=Quirks(literal_specials=0.02),
            stream_cancellation=True),
        _ep("Parasail", "parasail", "int4", 0.55, 2.60, 1.0, 50, 99.3, usage_counts_im_end=False),
        _ep("Moonshot AI", "moonshotai", "int4", 0.60, 2.50, 1.8, 33, 99.5),
        _ep("Venice", "venice", "unknown", 0.70, 2.80, 2.5, 25, 96.0, quirks=Quirks(inline_think=0.1)),
        _ep("Fireworks", "fireworks", "nvfp4", 0.35, 1.80, 0.5, 110, 99.9, stream_cancellation=True,
            tool_call_ids="call"),
        _ep("BaseTen", "baseten", "fp4", 0.38, 1.90, 0.6, 95, 0.0, status=STATUS_DOWN),
    ]


@dataclass(frozen=True)
class ProviderPrefs:
    """The request's `provider` object, parsed."""

    only: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    order: tuple[str, ...] = ()
    sort: str | None = None  # price | throughput | latency
    quantizations: tuple[str, ...] | None = None
    max_prompt_price: float | None = None  # USD per million
    max_completion_price: float | None = None
    allow_fallbacks: bool = True
    require_parameters: bool = False
    data_collection: str = "allow"


@dataclass
class EndpointOrder:
    """Endpoints in the order OpenRouter tries them, or why none is left."""

    endpoints: list[Endpoint]
    reason: str = ""  # the filter that emptied the list


def route(endpoints: list[Endpoint], prefs: ProviderPrefs, *, need_tokens: int = 0,
          used_parameters: frozenset[str] = frozenset(), tools: bool = False) -> EndpointOrder:
    """Filter then order endpoints as OpenRouter does; the first is tried first, the rest are fallbacks.
    A request with `tools` goes only to endpoints that list `tools`, with or without `require_parameters`."""
    eps = [e for e in endpoints if not e.down]
    reason = "that are currently available"
    steps: list[tuple[str, Callable[[Endpoint], bool]]] = [
        ("matching your provider 'only' list", lambda e: prefs.only is None or any(e.matches(n) for n in prefs.only)),
        ("after your provider 'ignore' list", lambda e: not any(e.matches(n) for n in prefs.ignore)),
        ("with the requested quantizations",
         lambda e: prefs.quantizations is None or e.quantization.lower() in prefs.quantizations),
        ("within your max_price",
         lambda e: (prefs.max_prompt_price is None or e.prompt_price <= prefs.max_prompt_price)
         and (prefs.max_completion_price is None or e.completion_price <= prefs.max_completion_price)),
        ("matching your data policy (data_collection: deny)",
         lambda e: prefs.data_collection != "deny" or e.data_collection == "deny"),
        ("that support tool use", lambda e: not tools or "tools" in e.supported_parameters),
        ("that support all the requested parameters",
         lambda e: not prefs.require_parameters or used_parameters <= set(e.supported_parameters)),
        ("that can fit the requested context", lambda e: need_tokens <= e.context_length),
    ]
    for what, keep in steps:
        if not eps:
            break
        kept = [e for e in eps if keep(e)]
        if not kept:
            reason = what
        eps = kept
    if not eps:
        return EndpointOrder([], reason)
    eps.sort(key=_sort_key(prefs.sort))
    if prefs.order:
        def rank(e: Endpoint) -> int:
            return next((i for i, n in enumerate(prefs.order) if e.matches(n)), len(prefs.order))
        eps.sort(key=rank)  # stable: `order` first, the sort within the rest
        if not prefs.allow_fallbacks:
            eps = [e for e in eps if rank(e) < len(prefs.order)]
    return EndpointOrder(eps)


def _sort_key(sort: str | None) -> Callable[[Endpoint], tuple[float, float]]:
    if sort == "throughput":
        return lambda e: (-e.throughput, e.prompt_price + e.completion_price)
    if sort == "latency":
        return lambda e: (e.latency, e.prompt_price + e.completion_price)
    # "price" and the default: cheapest first (OpenRouter's default weights by price; we keep it deterministic),
    # uptime breaking ties.
    return lambda e: (e.prompt_price + e.completion_price, -e.uptime)
