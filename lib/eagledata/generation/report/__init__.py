"""generation/report/: see README.md beside it."""
