"""bench/e2e_sync_vs_async.py's report without running either mode: the synchronous loop runs at each
of `--sync-threads` and every ratio is against the fastest of those runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import e2e_sync_vs_async as bench
from bench.proc_cpu import StepCpu

REPO = Path(__file__).resolve().parent.parent


def fake_result(seconds_a_step: float, steps: int = 11, reward: float = 0.5) -> dict[str, Any]:
    times = [i * seconds_a_step for i in range(steps)]
    return {"total_s": times[-1], "steps_s": times[-1], "rewards": [reward] * steps, "times": times}


def test_ratios_are_against_the_fastest_synchronous_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    threads_seen: list[int] = []

    async def sync_run(recipe: Any, steps: int, work: Path) -> dict[str, Any]:
        threads_seen.append(torch.get_num_threads())
        # one thread 0.1 s a step, two threads 0.2 s: the default (two) is the slower
        cpu_ms = {"generate": 40.0, "train": 50.0, "weights": 2.5}
        return {**fake_result(0.1 * torch.get_num_threads(), steps), "cpu_ms": cpu_ms}

    def async_run(recipe_path: Path, staleness: int, steps: int, work: Path) -> dict[str, Any]:
        cpu = StepCpu(2, 8, 125.0, 20.0, {"trainer": 120.0, "broker": 110.0})
        return {**fake_result(0.125, steps), "staleness": 1.5, "cpu": cpu}

    monkeypatch.setattr(bench, "sync_run", sync_run)
    monkeypatch.setattr(bench, "async_run", async_run)
    before = torch.get_num_threads()
    argv = ["e2e_sync_vs_async", "--recipe", str(REPO / "recipes" / "guess_number.yaml"), "--steps", "11"]
    monkeypatch.setattr(sys, "argv", [*argv, "--staleness", "2", "--sync-threads", "2", "1"])
    bench.main()
    out = capsys.readouterr().out
    assert threads_seen == [2, 1]
    assert torch.get_num_threads() == before  # the process's own setting is given back
    rows = {
        line.split()[0] + " " + line.split()[1]: line.split()
        for line in out.splitlines()
        if line[:5] in ("sync ", "async")
    }
    assert rows["sync 1t"][5] == "1.00"  # the baseline: the fastest
    assert rows["sync 2t"][5] == "0.50"
    assert rows["async s=2"][5] == "0.80"  # 0.1 / 0.125, not 0.2 / 0.125 against the default threads
    # where each mode's CPU went, a step
    assert "CPU ms a step, sync 1t: generate 40.0, train 50.0, weights 2.5; all 92.5" in out
    assert (
        "CPU ms a step, async s=2 (steps 2..8): trainer 120.0, broker 110.0; all 230.0, "
        "idle cores 20.0, wall 125.0" in out
    )


def test_rounds_alternate_the_modes_and_each_is_against_its_own_sync_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host that slows down between rounds: each round's ratio uses that round's sync run."""
    order: list[str] = []
    speed = iter([0.1, 0.11, 0.2, 0.2])  # round 1: sync, async; round 2: sync, async (the host 2x slower)

    async def sync_run(recipe: Any, steps: int, work: Path) -> dict[str, Any]:
        order.append(f"sync {work.parent.name}")
        return {**fake_result(next(speed), steps), "cpu_ms": {"generate": 1.0}}

    def async_run(recipe_path: Path, staleness: int, steps: int, work: Path) -> dict[str, Any]:
        order.append(f"async {work.name}")
        return {**fake_result(next(speed), steps), "staleness": 2.0, "cpu": None}

    monkeypatch.setattr(bench, "sync_run", sync_run)
    monkeypatch.setattr(bench, "async_run", async_run)
    argv = ["e2e_sync_vs_async", "--recipe", str(REPO / "recipes" / "guess_number.yaml"), "--steps", "11"]
    monkeypatch.setattr(sys, "argv", [*argv, "--staleness", "2", "--sync-threads", "1", "--rounds", "2"])
    bench.main()
    out = capsys.readouterr().out
    assert order == ["sync round-1", "async round-1", "sync round-2", "async round-2"]
    assert "round 1 of 2" in out and "round 2 of 2" in out
    # 0.1 / 0.11 in round 1, 0.2 / 0.2 in round 2: not 0.1 / 0.2 across rounds
    assert "async s=2    0.91 1.00; median 0.95, range 0.91-1.00" in out


def test_rounds_below_one_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["e2e_sync_vs_async", "--recipe", str(REPO / "recipes" / "guess_number.yaml"), "--rounds", "0"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit):
        bench.main()
