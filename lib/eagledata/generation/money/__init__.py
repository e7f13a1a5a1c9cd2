"""generation/money/: the money: what may start, what was spent, and what a killed run left (README.md beside it)."""
