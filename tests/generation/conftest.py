import pytest

from tests.helpers.parts import PartsMaker


@pytest.fixture
def parts(tmp_path, tok):
    """`parts(sizes, **settings)`: the engine's parts over datasets of `sizes` prompts (tests/helpers/parts.py),
    without a server; their stores closed after the test."""
    maker = PartsMaker(tmp_path, tok)
    yield maker
    maker.close()
