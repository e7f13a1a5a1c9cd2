"""Talking to OpenRouter (or any OpenAI-compatible server): the endpoint catalog and its prices, the
precision policy and routing decision, the request body, and a pure classification of every answer."""
from .answers import Completion, Kind, Outcome, build_request, classify_exception, classify_response
from .catalog import Catalog, Endpoint, Price, cheapest, fetch_catalog, fetch_catalog_async, worst_price
from .client import OPENROUTER_URL, Account, APIError, ClientPool, complete, read_account, resolve_api_key
from .config import ProvidersConfig
from .routing import (
                      Exclusion,
                      PrecisionPolicy,
                      RoutingDecision,
                      decide,
                      ignore_in_routing,
                      load_routing,
                      plot_providers,
                      precision_rank,
                      price_summary,
                      workload_costs,
)

__all__ = ["OPENROUTER_URL", "APIError", "Account", "Catalog", "ClientPool", "Completion", "Endpoint", "Exclusion",
           "Kind", "Outcome", "PrecisionPolicy", "ProvidersConfig", "Price", "RoutingDecision", "build_request",
           "cheapest", "classify_exception", "classify_response", "complete", "decide", "fetch_catalog",
           "fetch_catalog_async", "ignore_in_routing", "load_routing", "plot_providers", "precision_rank",
           "price_summary", "read_account", "resolve_api_key", "workload_costs", "worst_price"]
