"""Tests of eagledata/notebooks.py and of the notebooks in notebooks/, run by papermill or in JupyterLab (see tests/README.md)."""
