"""generation/plan/: see README.md beside it."""
