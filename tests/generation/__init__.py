"""Tests of eagledata.generation (see tests/README.md)."""
