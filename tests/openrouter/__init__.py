"""Tests of eagledata.openrouter (see tests/README.md)."""
