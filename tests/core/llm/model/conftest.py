"""Fixtures of the model tests."""

from __future__ import annotations

import pytest

from loomlab.core.llm.model import causal_lm


@pytest.fixture
def spy(monkeypatch):
    """Whether each call of ``fused_step`` answered (True) or left the step to the grid (False)."""
    answers: list[bool] = []
    real = causal_lm.fused_step

    def fused_step(*args):
        logits = real(*args)
        answers.append(logits is not None)
        return logits

    monkeypatch.setattr(causal_lm, "fused_step", fused_step)
    return answers
