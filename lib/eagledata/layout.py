"""The old name of `eagledata.paths`, kept only while `generation/` (being edited on another branch) still
imports it; new code imports `eagledata.paths`. Delete once generation's four imports have moved."""
from .paths import *  # noqa: F401,F403
