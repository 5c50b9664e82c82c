"""The learning statistics of the run summary, on known series."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.runner.report import learning, permutation_p_value


def series(values: list[float]) -> list[dict[str, float]]:
    return [{"reward.success": v} for v in values]


def test_tenths_of_a_run_that_learned_then_slipped() -> None:
    # 20 steps (tenths of 2): rises to a peak of 1.0 at steps 12-13, ends at 0.6
    values = [
        0.0,
        0.0,
        0.1,
        0.2,
        0.3,
        0.4,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
        0.9,
        1.0,
        1.0,
        0.9,
        0.8,
        0.7,
        0.7,
        0.6,
        0.6,
    ]
    out = learning(series(values), "reward.success")
    assert out["steps"] == 20
    assert out["first_tenth"] == pytest.approx(0.0) and out["last_tenth"] == pytest.approx(0.6)
    assert out["best_tenth"] == pytest.approx(1.0) and out["improvement"] == pytest.approx(0.6)
    assert out["p_value"] < 0.5


def test_a_flat_run_learned_nothing() -> None:
    out = learning(series([0.5] * 30), "reward.success")
    assert out["improvement"] == 0 and out["best_tenth"] == pytest.approx(0.5) and out["p_value"] == 1.0


def test_the_permutation_test_matches_the_exact_one() -> None:
    # 5 against 5, fully separated: 1 of the C(10, 5) = 252 splits is as extreme as the observed one
    assert permutation_p_value([0.0] * 5, [1.0] * 5) == pytest.approx(1 / 252, abs=0.0015)
    assert permutation_p_value([1.0] * 5, [0.0] * 5) == 1.0  # a fall is no rise
    # 0 0 1 | 0 1 1: splits whose second half sums to 2 or more: C(3,2)C(3,1) + C(3,3) = 10 of 20
    assert permutation_p_value([0.0, 0.0, 1.0], [0.0, 1.0, 1.0]) == pytest.approx(0.5, abs=0.02)
    assert permutation_p_value([], [1.0]) == 1.0


def test_too_short_a_run_has_no_statistics() -> None:
    assert learning(series([0.1] * 9), "reward.success") == {"steps": 9.0}


def test_tensorboard_reads_every_metric_back_per_component(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from astraflow.runner.report import write_tensorboard

    rows = [
        {
            "component": "trainer",
            "id": "trainer.solver",
            "step": s,
            "time": 100.0 + s,
            "values": {"loss": 0.5 / s, "reward.mean": s / 10},
        }
        for s in range(1, 4)
    ]
    rows.append(
        {"component": "worker", "id": "w0", "step": -1, "time": 107.5, "values": {"worker.tokens": 42.0}}
    )
    write_tensorboard(rows, tmp_path)
    trainer = EventAccumulator(str(tmp_path / "trainer" / "trainer.solver"))
    trainer.Reload()
    assert sorted(trainer.Tags()["scalars"]) == ["loss", "reward.mean"]
    loss = trainer.Scalars("loss")
    assert [e.step for e in loss] == [1, 2, 3] and [e.wall_time for e in loss] == [101.0, 102.0, 103.0]
    assert [e.value for e in loss] == pytest.approx([0.5, 0.25, 0.5 / 3])
    worker = EventAccumulator(str(tmp_path / "worker" / "w0"))
    worker.Reload()
    (tokens,) = worker.Scalars("worker.tokens")
    assert (tokens.step, tokens.value) == (6, 42.0)  # no step: seconds since the first row
