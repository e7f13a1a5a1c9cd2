"""Settings that more than one notebook or command has, each with its one default and help.

A name that appears in several stages (the reserve in budget.ipynb and generate.ipynb, the model in
providers.ipynb and generate.ipynb, the tokenizer in four notebooks, …) is declared with `shared(name)`, which
takes its default from here, so a notebook and a command cannot drift apart. `tests/test_settings.py` checks
that every settings class agrees on every name it shares with another.
"""
from __future__ import annotations

from typing import Any

from .paths import DATASETS_FILE, OUTPUT_DIR, PARAMS_DIR

OPENROUTER_URL = "https://openrouter.ai/api/v1"
# `base_url: emulator`: the stage starts the OpenRouter emulator on this machine for its run and stops it after
# (emulator_process.py `serving`), so trying a file offline is one step: no server to start, no port, no key.
EMULATOR = "emulator"
# Its delays against the real service's: 0.02 makes a typical answer (~2,000 tokens at ~40 tok/s, ~50 s) take
# about a second, so a small file finishes in seconds while the answers still take ~100x the client's work on them.
EMULATOR_SPEED = 0.02


def is_emulator(base_url: str) -> bool:
    """`base_url` asks for an emulator started for the run."""
    return base_url.strip().lower() == EMULATOR

# name -> (default, help)
SHARED: dict[str, tuple[Any, str]] = {
    "model": ("moonshotai/kimi-k2.5", "model id sent with every request"),
    "base_url": (OPENROUTER_URL, "OpenRouter; emulator: one started on this machine for the run (no key; "
                                 "writes under outputs/emulator/); or a server's URL"),
    "api_key_env": ("OPENROUTER_API_KEY", "the key is read from this variable only, never stored"),
    "tokenizer": (None, "local dir or hub id; None -> $EAGLEDATA_TOKENIZER_DIR, else the bundled Kimi K2.5 files"),
    "datasets_file": (DATASETS_FILE, "name -> {prompts, target_output_tokens}"),
    "params_dir": (PARAMS_DIR, "the routing decision is <params_dir>/routing/<model>.yaml"),
    "output_dir": (OUTPUT_DIR, "where runs write (records under <output_dir>/datasets/)"),
    "concurrency": (2000, "requests in flight"),
    "max_tokens": (32768, "generation cap per request (reasoning included)"),
    "reserve_usd": (5.0, "account balance never spent (nor planned)"),
    "prior_output_median_tokens": (3000.0, "output-length guess before any records exist"),
    "prior_output_sigma": (0.9, "log-normal spread of that guess"),
    "turns": ("all", "all: every user turn answered on the model's own earlier answers (a request per turn); "
                     "last: only the last, on the dataset's answers (a request per prompt)"),
    "status_interval_s": (10.0, "seconds between status lines when no widget shows progress"),
    "snapshot": (None, "a saved endpoints snapshot (JSON) -> offline, no server"),
    "limit": (None, "at most this many; None -> all"),
    "batch_window": ("24h", "route batch: each batch's completion window, 12h to 7d"),
    "bootstrap_seed": (0, "the bootstrap's seed (the reports' intervals)"),
    "emulator_speed": (EMULATOR_SPEED, "base_url emulator: its delays x this (1: real latencies; 0.02: a ~50 s "
                                       "answer in ~1 s)"),
}


def shared(name: str, help: str | None = None, **kw: Any) -> Any:
    """The settings field of a shared name: its one default, and its help unless a stage says more."""
    from .settings import setting

    default, text = SHARED[name]
    return setting(default, help or text, **kw)
