"""Tests of eagledata.emulator (see tests/README.md)."""
