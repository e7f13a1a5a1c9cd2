"""The test suite (layout and rules: tests/README.md)."""
