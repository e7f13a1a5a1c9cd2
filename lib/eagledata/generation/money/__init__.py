"""generation/money/: see README.md beside it."""
