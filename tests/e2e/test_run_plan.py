"""What `astraflow run` starts for a recipe: components in order, and the cores shared among the
torch processes (no process may start one torch thread per core on a machine they all share)."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.config import load_recipe
from astraflow.runner.plan import RunOptions, components
from tests.conftest import REPO


def test_components_start_in_order_and_share_the_cores(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(8)))
    path = REPO / "recipes" / "referential_game.yaml"
    plan = components(load_recipe(path), path, tmp_path, RunOptions(workers=2))
    assert [c.name for c in plan] == [
        "trainer-speaker",
        "trainer-listener",
        "streams",
        "worker-0",
        "worker-1",
        "feeder",
    ]
    assert [c.stage for c in plan] == sorted(c.stage for c in plan)
    # 8 cores among 2 trainers and 2 workers
    assert {c.env["OMP_NUM_THREADS"] for c in plan} == {"2"}

    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1})
    plan = components(load_recipe(path), path, tmp_path, RunOptions(workers=3))
    assert {c.env["OMP_NUM_THREADS"] for c in plan} == {"1"}  # never 0


def test_a_thread_count_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    path = REPO / "recipes" / "arithmetic.yaml"
    plan = components(load_recipe(path), path, tmp_path, RunOptions())
    assert all("OMP_NUM_THREADS" not in c.env for c in plan)
