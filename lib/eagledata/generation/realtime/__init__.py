"""generation/realtime/: see README.md beside it."""
