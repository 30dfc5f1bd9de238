"""Fixtures the panel tests share."""

from __future__ import annotations

import pytest

from loomlab.views.workers import JobRunner


@pytest.fixture
def runner():
    """A JobRunner every job of which has ended when the test does (else the test fails)."""
    r = JobRunner()
    yield r
    assert r.shutdown()
