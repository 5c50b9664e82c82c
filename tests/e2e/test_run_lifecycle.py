"""`astraflow run` as a user runs it: its own local broker, Ctrl-C, nothing left behind, resume."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest

from astraflow.broker.jvm import QUICK_JIT
from tests.conftest import subprocess_env
from tests.e2e.helpers import (
    TINY,
    endless_recipe,
    finish,
    processes_of,
    recipe_copy,
    start_run,
    summary,
    trainer_steps,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.slow]


def trained_groups(run_dir: Path, policy: str) -> list[str]:
    ledger = run_dir / "trainer" / policy / "trained.jsonl"
    groups: list[str] = []
    for line in ledger.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("trained"):
            groups.extend(entry["groups"])
    return groups


def test_ctrl_c_leaves_nothing_running_and_a_second_run_resumes(tmp_path: Path) -> None:
    recipe = endless_recipe(tmp_path)
    run_dir = tmp_path / "run"
    env = subprocess_env()  # no ASTRAFLOW_BOOTSTRAP: the run starts its own broker in the run directory

    first = start_run(recipe, run_dir, env)
    wait_for(
        lambda: trainer_steps(run_dir, "solver") >= 3 or first.poll() is not None, 600, "three trainer steps"
    )
    assert first.poll() is None, first.communicate()[0][-3000:]
    first.send_signal(signal.SIGINT)
    out = finish(first, 240)
    assert first.returncode == 0, out[-3000:]
    assert "stopping: interrupted" in out
    assert "Connection refused" not in out  # no client of the run outlives its broker
    assert "[progress] " in out  # printed as text, not eaten as a rich style tag
    assert processes_of(run_dir) == []  # no component, no broker
    s1 = summary(run_dir)
    assert s1["stop_reason"] == "interrupted"
    steps_before = s1["policies"]["solver"]["steps"]
    assert steps_before >= 3
    for name in (
        "metrics.jsonl",
        "summary.txt",
        "plots/reward.png",
        "plots/throughput.png",
        "plots/staleness.png",
    ):
        assert (run_dir / name).exists(), name
    assert "\nscaling: " in (run_dir / "summary.txt").read_text()  # what bounded the run (advice.py)
    assert any((run_dir / "tensorboard").rglob("events.out.tfevents.*"))

    target = steps_before + 3
    second = start_run(recipe, run_dir, env, "--max-steps", str(target))
    out = finish(second, 600)
    assert second.returncode == 0, out[-3000:]
    assert "resuming arithmetic" in out
    assert "Connection refused" not in out
    assert f"every trainer reached {target} steps" in out
    assert processes_of(run_dir) == []
    assert "resumed from" in (run_dir / "logs" / "trainer-solver.log").read_text()
    assert summary(run_dir)["policies"]["solver"]["steps"] >= target
    groups = trained_groups(run_dir, "solver")
    assert len(groups) == len(set(groups)), "a group was trained twice across the restart"
    assert len(groups) >= 2 * target  # every step trained batch_groups groups


def test_a_killed_supervisor_takes_its_components_and_broker_with_it(tmp_path: Path) -> None:
    recipe = endless_recipe(tmp_path)
    run_dir = tmp_path / "run"
    proc = start_run(recipe, run_dir, subprocess_env())
    wait_for(lambda: trainer_steps(run_dir, "solver") >= 1 or proc.poll() is not None, 600, "a trainer step")
    assert proc.poll() is None, f"astraflow run exited with {proc.returncode}:\n{finish(proc, 60)[-6000:]}"
    running = processes_of(run_dir)
    assert len(running) >= 5  # broker, trainer, streams, worker, feeder
    # the run's own broker lives as long as the run: it compiles with C1 only (broker.jvm.jvm_flags)
    assert [QUICK_JIT in cmd.split() for _, cmd in running if "kafka.Kafka" in cmd] == [True]
    proc.kill()  # SIGKILL: no chance to clean up; PR_SET_PDEATHSIG must do it
    proc.communicate(timeout=60)
    wait_for(lambda: processes_of(run_dir) == [], 120, "every process of the run to exit")


def test_a_broker_that_fails_to_start_stops_the_components_waiting_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The components start while the run's broker boots and wait for their topics; when the broker
    then fails, they stop at their SIGTERM (a clean exit), not at the SIGKILL after their grace."""
    import time

    from astraflow.errors import BrokerError
    from astraflow.runner import run as run_module
    from astraflow.runner.plan import RunOptions

    recipe = recipe_copy("arithmetic", tmp_path, model=TINY, worker={"count": 1})

    def failing_start(*_args: Any, on_address: Callable[[str], None], **_kwargs: Any) -> NoReturn:
        on_address("127.0.0.1:9")  # nothing listens there: the components wait
        time.sleep(12)  # long enough for them to load their models and reach their wait
        raise BrokerError("the Kafka JVM exited with status 1 during start-up")

    monkeypatch.setattr(run_module.broker, "start", failing_start)
    for name, value in subprocess_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("ASTRAFLOW_BOOTSTRAP", raising=False)
    run = run_module.Run(recipe, RunOptions(run_dir=tmp_path / "run", dashboard=False))
    with pytest.raises(BrokerError, match="exited with status 1"):
        run.execute()
    assert run.sup is not None and {c.name for c in run.sup.components} == {
        "trainer-solver",
        "streams",
        "worker-0",
        "feeder",
    }
    assert {c.name: c.exit_code for c in run.sup.components} == dict.fromkeys(
        ("trainer-solver", "streams", "worker-0", "feeder"), 0
    )
