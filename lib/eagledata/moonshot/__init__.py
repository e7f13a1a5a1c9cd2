"""Moonshot AI's own API: the Batch API dialect of the batch route (facts.py: models, prices, windows)."""
