"""What the tests share and are not tests themselves: builders of catalogs, records and prompts, the kill
harness, the trainers' readers and the vLLM server harness (see tests/README.md)."""
from pathlib import Path

HELPERS = Path(__file__).resolve().parent
ROOT = HELPERS.parents[1]  # the checkout: tests/helpers/ -> tests/ -> the root
DATA = HELPERS.parent / "data"  # tests/data/: files the tests compare against
