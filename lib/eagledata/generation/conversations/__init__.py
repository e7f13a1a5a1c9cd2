"""generation/conversations/: conversations and their records: from a prompt's turns to exactly-once records (README.md beside it)."""
