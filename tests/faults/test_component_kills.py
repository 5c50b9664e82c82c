"""Every component of a real `astraflow run` SIGKILLed while it trains, and the run's ledger at
drain: every task fed trained exactly once or dropped with a reason, nothing lost, no stall.

One run against the session's broker: its supervisor is SIGKILLed after two steps and a new
`astraflow run` resumes the run directory; the resumed run loses its trainer at three failpoints
(mid-step, mid-checkpoint, mid-publication), its feeder after every 10th task it publishes (between
two saves of its position: the hang a chaos run found), its streams worker half-way through
emitting every 8th group, and its worker to a SIGKILL from outside."""

from __future__ import annotations

import time
from pathlib import Path

from astraflow.failpoints import TRAINER_ENV
from astraflow.runner.ledger import build
from tests.e2e.helpers import run_env
from tests.faults.harness import (
    BATCH_GROUPS,
    KINDS,
    RUN_MARKS,
    component_pids,
    drain,
    fault_recipe,
    kill_component,
    settings_of,
    start_run,
    stop,
    wait_steps,
)

pytestmark = RUN_MARKS  # a loaded 2-core machine: restarts take minutes


def spawns(run_dir: Path, name: str) -> int:
    """How many times the supervisors started component `name` (a header line per start)."""
    return (run_dir / "logs" / f"{name}.log").read_text(errors="replace").count("\n==== ")


def test_each_component_and_the_supervisor_killed_mid_run_lose_and_duplicate_nothing(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    recipe = fault_recipe(tmp_path / "arithmetic.yaml")
    run_dir = tmp_path / "run"
    env = run_env(kafka_bootstrap)

    first = start_run(recipe, run_dir, env)
    wait_steps(run_dir, "solver", 2, first, 900)
    first.kill()  # the supervisor: its components get SIGTERM by PR_SET_PDEATHSIG and stop
    first.communicate(timeout=60)
    deadline = time.monotonic() + 120
    while any(component_pids(run_dir, k) for k in KINDS):
        assert time.monotonic() < deadline, "components outlived their SIGKILLed supervisor by 120 s"
        time.sleep(0.5)

    # the stopped trainer checkpointed its last step; the failpoints come after it, whatever it was
    at = max(
        int(p.name.split("-")[1]) for p in (run_dir / "trainer" / "solver" / "checkpoints").glob("step-*")
    )
    points = {"mid_step": at + 2, "mid_checkpoint": at + 4, "mid_publication": at + 6}
    faulty = env | {
        TRAINER_ENV: ",".join(f"{k}:{v}" for k, v in points.items()),
        "ASTRAFLOW_FEEDER_FAILPOINT": "after_publish:10",
        "ASTRAFLOW_STREAMS_FAILPOINT": "mid_emit:8",
    }
    second = start_run(recipe, run_dir, faulty)
    try:
        wait_steps(run_dir, "solver", at + 3, second, 900)
        kill_component(run_dir, "worker")
        wait_steps(run_dir, "solver", at + 10, second, 900)  # no stall: past every failpoint
        ledger = drain(run_dir, second, env, ["solver"], BATCH_GROUPS)
    finally:
        out = stop(second, 300)
    assert second.returncode == 0, out[-3000:]
    assert "resuming arithmetic" in out

    fired = {p.name for p in (run_dir / "trainer" / "solver").glob("failpoint-*")}
    assert fired == {f"failpoint-{k}-{v}" for k, v in points.items()}
    assert spawns(run_dir, "trainer-solver") >= 5, "two runs plus a restart per failpoint"
    for name in ("feeder", "streams", "worker-0"):
        assert spawns(run_dir, name) >= 3, f"{name} was not killed in the resumed run"
    assert ledger.problems(BATCH_GROUPS) == [], ledger.line()
    trained = ledger.policies["solver"].counts()["trained"]
    assert trained >= (at + 10) * BATCH_GROUPS, ledger.line()
    # taken again after the run stopped: the same, nothing fed after the drain
    again = build(run_dir, settings_of(run_dir, env), ["solver"])
    assert again.problems(BATCH_GROUPS) == [] and again.to_json() | {
        "stream_drop_reasons": {}
    } == ledger.to_json() | {"stream_drop_reasons": {}}, (again.line(), ledger.line())
