"""OpenRouter emulator: the embedded default server for the demo and every network test.

`run_emulator(config, **overrides)` starts it as a subprocess and yields an `EmulatorHandle`
(`base_url`, admin helpers); `python -m eagledata.emulator --port PORT --config FILE` serves it.
"""
from .config import EmulatorConfig, load_config, parse_config
from .process import EmulatorHandle, run_emulator

__all__ = ["EmulatorConfig", "EmulatorHandle", "load_config", "parse_config", "run_emulator"]
