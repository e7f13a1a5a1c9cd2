"""What Moonshot's Batch API documents (platform.kimi.ai, "Batch API" guide and reference, late 2026), in one place:
the models it serves in batch, their prices, the completion windows it takes, and the body fields it refuses.

Pure data and two checks; the client (`batch_api.py`) and the planners (budget's route plan, the batch route) read
them, so a price or a window changes here once.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

BATCH_BASE_URL = "https://api.moonshot.ai/v1"
BATCH_KEY_ENV = "MOONSHOT_API_KEY"
PROVIDER = "Moonshot AI (batch)"  # a batch record's `provider`: the first-party weights, through the Batch API
DISCOUNT = 0.40  # off the realtime price


@dataclass(frozen=True)
class BatchModel:
    """A model the Batch API serves: its realtime price and the batch price (USD per million tokens), and the
    release whose weights answer (`release`, a Hugging Face id): its tokenizer and chat template are that release's,
    so the records' ids are right only when the run's tokenizer is of the same release."""

    name: str
    realtime_prompt_per_m: float
    realtime_completion_per_m: float
    release: str = ""

    @property
    def release_slug(self) -> str:
        """`moonshotai/Kimi-K2.5` → `kimi-k2.5`: how a tokenizer's directory names the release."""
        return self.release.rsplit("/", 1)[-1].lower()

    @property
    def prompt_per_m(self) -> float:
        return round(self.realtime_prompt_per_m * (1 - DISCOUNT), 6)

    @property
    def completion_per_m(self) -> float:
        return round(self.realtime_completion_per_m * (1 - DISCOUNT), 6)

    def cost(self, prompt_tokens: float, completion_tokens: float) -> float:
        """USD at the batch price."""
        return (prompt_tokens * self.prompt_per_m + completion_tokens * self.completion_per_m) / 1e6


# By the public price tables: $0.60 / $3.00 per M input / output realtime → $0.36 / $1.80 in batch.
BATCH_MODELS: dict[str, BatchModel] = {m.name: m for m in (
    BatchModel("kimi-k2.5", 0.60, 3.00, "moonshotai/Kimi-K2.5"),
    BatchModel("kimi-k2.6", 0.60, 3.00, "moonshotai/Kimi-K2.6"))}
# Sampling fields kimi-k2.5/k2.6 take no value for: a line setting one fails the batch's validation.
FIXED_SAMPLING = ("temperature", "top_p", "n", "presence_penalty", "frequency_penalty")
MIN_WINDOW_H, MAX_WINDOW_H = 12, 7 * 24
MAX_FILE_BYTES = 100 * 1024 * 1024
MAX_BATCH_FILES = 1000

_WINDOW = re.compile(r"^(\d+)([hd])$")


def window_hours(window: str) -> int:
    """`24h` / `7d` → hours, within the documented 12 h – 7 d; ValueError (saying what it takes) otherwise."""
    m = _WINDOW.match(window.strip()) if isinstance(window, str) else None
    if m is None:
        raise ValueError(f"{window!r} is not a completion window: <hours>h or <days>d, from {MIN_WINDOW_H}h to 7d")
    hours = int(m.group(1)) * (24 if m.group(2) == "d" else 1)
    if not MIN_WINDOW_H <= hours <= MAX_WINDOW_H:
        raise ValueError(f"{window!r} is outside the Batch API's windows ({MIN_WINDOW_H}h to 7d)")
    return hours


def batch_model(name: str) -> BatchModel:
    """The Batch API's model of that name; ValueError naming the ones it serves."""
    try:
        return BATCH_MODELS[name]
    except KeyError:
        raise ValueError(f"{name!r} is not served by Moonshot's Batch API (it serves "
                         f"{', '.join(sorted(BATCH_MODELS))})") from None


def tokenizer_release(directory: str | Path) -> str | None:
    """The release a tokenizer directory is of (lower case, `kimi-k2.5`), as far as its path says: a Hugging Face
    cache snapshot (`…/models--moonshotai--Kimi-K2.6/snapshots/<revision>`), or a directory (or one of its two
    parents) named as a release the Batch API serves (the bundled `assets/kimi-k2.5`); None when it says none."""
    parts = [part.lower() for part in Path(directory).parts]
    for part in reversed(parts):
        if part.startswith("models--") and part.count("--") >= 2:
            return part.split("--", 2)[2]
    known = {m.release_slug for m in BATCH_MODELS.values()}
    return next((part for part in reversed(parts[-3:]) if part in known), None)
