"""generation/conversations/: see README.md beside it."""
