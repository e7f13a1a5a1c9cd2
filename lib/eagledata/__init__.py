"""eagledata: EAGLE-3 training data from a reasoning model served over an API."""
__version__ = "0.1.0"
