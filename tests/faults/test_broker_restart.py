"""The broker of a real `astraflow run` SIGKILLed while every client runs, and started again on
its data directory with `astraflow broker start`: same port, so every client reconnects by itself;
the run reaches its steps and its ledger at drain shows nothing lost and nothing duplicated."""

from __future__ import annotations

import time
from pathlib import Path

from tests.conftest import subprocess_env
from tests.e2e.helpers import processes_of, trainer_steps
from tests.faults.harness import (
    BATCH_GROUPS,
    KINDS,
    RUN_MARKS,
    broker_state,
    component_pids,
    drain,
    fault_recipe,
    kill_broker,
    restart_broker,
    start_run,
    stop,
    wait_steps,
)

pytestmark = RUN_MARKS  # a loaded 2-core machine: restarts take minutes


def test_a_broker_killed_and_restarted_under_load_loses_nothing(tmp_path: Path) -> None:
    recipe = fault_recipe(tmp_path / "arithmetic.yaml")
    run_dir = tmp_path / "run"
    env = subprocess_env()  # no ASTRAFLOW_BOOTSTRAP: the run starts its own broker in the run directory
    proc = start_run(recipe, run_dir, env)
    try:
        wait_steps(run_dir, "solver", 3, proc, 900)
        before = broker_state(run_dir / "broker")
        kill_broker(run_dir / "broker")
        time.sleep(5)  # every client loses its connections
        assert all(component_pids(run_dir, k) for k in KINDS), "a client died with the broker"
        at_kill = trainer_steps(run_dir, "solver")
        assert restart_broker(run_dir / "broker") == before["bootstrap"]
        assert broker_state(run_dir / "broker")["pid"] != before["pid"]
        wait_steps(run_dir, "solver", at_kill + 4, proc, 900)  # no stall: the clients reconnected
        ledger = drain(run_dir, proc, env, ["solver"], BATCH_GROUPS)
    finally:
        out = stop(proc, 300)
    assert proc.returncode == 0, out[-3000:]
    assert processes_of(run_dir) == []  # the restarted broker is stopped with the run
    assert ledger.problems(BATCH_GROUPS) == [], ledger.line()
    assert ledger.policies["solver"].counts()["trained"] >= (at_kill + 4) * BATCH_GROUPS, ledger.line()
