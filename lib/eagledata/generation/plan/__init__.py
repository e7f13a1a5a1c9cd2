"""generation/plan/: the time–money plan: targets that fit the budget, by route (README.md beside it)."""
