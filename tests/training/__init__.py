"""Tests of eagledata.training (see tests/README.md)."""
