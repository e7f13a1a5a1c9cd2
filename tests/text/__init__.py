"""Tests of eagledata.text (see tests/README.md)."""
