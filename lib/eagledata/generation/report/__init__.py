"""generation/report/: what a run shows: progress, the live panel, the run report's tables and plots (README.md beside it)."""
