"""The openrouter stage's notebook settings: providers.ipynb's (`ProvidersConfig`).

The rule (lib/eagledata/README.md): a notebook's settings class lives in `config.py` of the package that owns its
stage; its parameters cell is made from these fields, and the domain modules take the values they need as
arguments (here `policy()` gives `routing.decide` its `PrecisionPolicy`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..defaults import is_emulator, shared
from ..paths import emulator_dirs
from ..settings import Settings, setting
from .routing import PrecisionPolicy


@dataclass(kw_only=True)
class ProvidersConfig(Settings):
    """Every setting of providers.ipynb (its parameters cell is made from these fields)."""

    model: str = shared("model")
    base_url: str = shared("base_url")
    api_key_env: str = shared("api_key_env")
    snapshot: str | None = shared("snapshot", "a saved endpoints snapshot (JSON) -> re-run offline, no server")
    native_precision: str | None = setting(None, "None -> known for the model (kimi-k2.5: int4)")
    unknown_policy: Literal["keep", "exclude"] = setting(
        "keep", "keep (flagged) or exclude endpoints of unknown quantization")
    require_reasoning: bool = setting(True, "exclude endpoints that cannot return reasoning")
    require_tools: bool = setting(True, "exclude endpoints that cannot take tools (K2.5 is served as an agent)")
    stream_cancellation: dict[str, bool] | None = setting(
        None, "provider or tag -> true/false: does closing its stream stop the billing (default: OpenRouter's docs; "
              "unlisted: no)")
    workload_prompt_tokens: int = setting(30_000_000, "planned workload for the pricing table: prompt tokens")
    workload_output_tokens: int = setting(42_000_000, "and output tokens")
    params_dir: str = shared("params_dir", "the decision goes to <params_dir>/routing/<model>.yaml")
    output_dir: str = shared("output_dir", "the listing snapshot goes to <output_dir>/providers/")

    def __post_init__(self) -> None:
        super().__post_init__()
        if is_emulator(self.base_url):  # the emulated catalog's decision stays out of the real params/
            self.output_dir, self.params_dir = emulator_dirs(self.output_dir, self.params_dir)

    def policy(self) -> PrecisionPolicy:
        return PrecisionPolicy.for_model(self.model, self.native_precision, unknown=self.unknown_policy,
                                         require_reasoning=self.require_reasoning, require_tools=self.require_tools)
