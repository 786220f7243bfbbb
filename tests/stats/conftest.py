"""Fixtures of the end-to-end statistical tests: the tiny target of the two-token setting (two_tokens.py) and
the exact joint distribution of its first two generated tokens, built once per module."""
from __future__ import annotations

import pytest

from specdecode.core.target import Target
from tests.stats.two_tokens import exact_pairs, tiny_target


@pytest.fixture(scope="module")
def target() -> Target:
    return tiny_target()


@pytest.fixture(scope="module")
def exact(target) -> dict:
    return exact_pairs(target)
