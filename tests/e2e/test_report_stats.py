"""The learning statistics of the run summary, on known series."""

from __future__ import annotations

import pytest

from astraflow.runner.report import learning


def series(values: list[float]) -> list[dict[str, float]]:
    return [{"reward.success": v} for v in values]


def test_tenths_of_a_run_that_learned_then_slipped() -> None:
    # 20 steps (tenths of 2): rises to a peak of 1.0 at steps 12-13, ends at 0.6
    values = [0.0, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.9, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.6, 0.6]
    out = learning(series(values), "reward.success")
    assert out["steps"] == 20
    assert out["first_tenth"] == pytest.approx(0.0) and out["last_tenth"] == pytest.approx(0.6)
    assert out["best_tenth"] == pytest.approx(1.0) and out["improvement"] == pytest.approx(0.6)
    assert out["p_value"] < 0.5


def test_a_flat_run_learned_nothing() -> None:
    out = learning(series([0.5] * 30), "reward.success")
    assert out["improvement"] == 0 and out["best_tenth"] == pytest.approx(0.5) and out["p_value"] == 1.0


def test_too_short_a_run_has_no_statistics() -> None:
    assert learning(series([0.1] * 9), "reward.success") == {"steps": 9.0}
