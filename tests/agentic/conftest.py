"""The bfcl-eval wheel, fetched once into the cache the quality tests use (`$EAGLEDATA_QUALITY_CACHE`, else
`.cache/quality`; `make test` sets it): from the package index on a fresh machine, never from anywhere else. A wheel
that cannot be had fails the tests that need it, never skips them."""
from __future__ import annotations

from pathlib import Path

import pytest

from eagledata.agentic import Task, bfcl_code, bfcl_wheel, read_bfcl_tasks, read_ground_truth
from eagledata.agentic.calls import Call
from eagledata.errors import InputError


@pytest.fixture(scope="session")
def bfcl_wheel_path(smollm2_cache) -> Path:
    try:
        return bfcl_wheel(smollm2_cache)
    except InputError as e:
        pytest.fail(f"no bfcl-eval wheel: {e}")


@pytest.fixture(scope="session")
def bfcl_backends(bfcl_wheel_path, smollm2_cache) -> list[str]:
    """The code path a BFCL environment imports its backends from."""
    return [str(bfcl_code(bfcl_wheel_path, smollm2_cache))]


@pytest.fixture(scope="session")
def bfcl_tasks(bfcl_wheel_path) -> list[Task]:
    return read_bfcl_tasks(bfcl_wheel_path)


@pytest.fixture(scope="session")
def ground_truth(bfcl_wheel_path, bfcl_tasks) -> dict[str, list[list[Call]]]:
    return read_ground_truth(bfcl_wheel_path, bfcl_tasks)
