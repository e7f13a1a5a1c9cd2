"""generation/realtime/: the realtime route: the engine and its loop parts (README.md beside it)."""
