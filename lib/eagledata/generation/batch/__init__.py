"""generation/batch/: see README.md beside it."""
