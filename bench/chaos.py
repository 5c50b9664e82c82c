"""`make chaos`: the long fault-injection run. One `astraflow run` of recipes/arithmetic.yaml (tiny
model, its own broker in the run directory) takes, in a shuffled order, at least `--kills` SIGKILLs
of each component kind (worker, streams, trainer, feeder), `--kills` SIGKILLs of the supervisor each
followed by a resume on the same run directory, and `--broker-restarts` SIGKILLs of the broker each
followed by `astraflow broker start` on its data directory while every client runs. The trainer is
also killed at its failpoints (mid-step, mid-checkpoint, mid-publication). After every fault the
trainer must advance `--steps-between` steps within `--stall-s` seconds (else: a stall). At the end
the run is drained and its ledger taken (astraflow/runner/ledger.py): lost, duplicated, stalls.

    PYTHONPATH=. python -m bench.chaos [--kills 10] [--seed 0] [--out bench/chaos-result.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import tempfile
import time
from pathlib import Path

from astraflow.runner.ledger import build
from tests.conftest import REPO, subprocess_env
from tests.e2e.helpers import finish, processes_of, start_run, trainer_steps
from tests.faults.harness import (
    KINDS,
    TINY,
    component_pids,
    drain,
    kill_broker,
    kill_component,
    restart_broker,
    settings_of,
    wait_steps,
    write_recipe,
)

POLICY = "solver"
BATCH_GROUPS = 2
TRAINER_FAILPOINTS = "mid_step:7,mid_checkpoint:23,mid_publication:41,mid_step:60,mid_checkpoint:80,mid_publication:99"


def plan(kills: int, broker_restarts: int, rng: random.Random) -> list[str]:
    events = [k for k in KINDS for _ in range(kills)] + ["supervisor"] * kills
    rng.shuffle(events)
    for i in range(broker_restarts):  # spread out, never first
        events.insert((i + 1) * len(events) // (broker_restarts + 1), "broker")
    return events


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--broker-restarts", type=int, default=2)
    ap.add_argument("--steps-between", type=int, default=2)
    ap.add_argument("--stall-s", type=float, default=400.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "chaos-result.json")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="astraflow-chaos-"))
    run_dir = root / "run"
    recipe = write_recipe(root / "arithmetic.yaml", REPO / "recipes" / "arithmetic.yaml", model=TINY,
                          worker={"count": args.workers}, feeder={"group_size": 4},
                          trainer={"batch_groups": BATCH_GROUPS}, run={"max_steps": None})
    env = subprocess_env(ASTRAFLOW_TRAINER_FAILPOINT=TRAINER_FAILPOINTS)  # no bootstrap: its own broker
    events = plan(args.kills, args.broker_restarts, rng)
    done: dict[str, int] = {}
    stalls: list[str] = []
    recoveries: list[float] = []
    started = time.time()
    print(f"[chaos] {len(events)} faults, run dir {run_dir}", flush=True)
    proc = start_run(recipe, run_dir, env)
    steps = 0  # metrics.jsonl starts again empty at each resume: the highest step seen so far
    try:
        for i, event in enumerate(events):
            steps = max(steps, trainer_steps(run_dir, POLICY))
            target = steps + args.steps_between
            try:
                recoveries.append(wait_steps(run_dir, POLICY, target, proc, args.stall_s))
            except AssertionError as exc:
                stalls.append(f"before fault {i} ({event}): {exc}")
                print(f"[chaos] STALL {stalls[-1][:2000]}", flush=True)
                break
            if event == "supervisor":
                proc.kill()
                proc.communicate(timeout=60)
                deadline = time.monotonic() + 120  # its components get SIGTERM (PR_SET_PDEATHSIG)
                while any(component_pids(run_dir, k) for k in KINDS) and time.monotonic() < deadline:
                    time.sleep(0.5)
                proc = start_run(recipe, run_dir, env)
            elif event == "broker":
                kill_broker(run_dir)
                time.sleep(5)  # every client notices
                restart_broker(run_dir)
            else:
                kill_component(run_dir, event)
            done[event] = done.get(event, 0) + 1
            print(f"[chaos] {time.time() - started:6.0f}s fault {i + 1}/{len(events)}: {event} at step "
                  f"{trainer_steps(run_dir, POLICY)}", flush=True)
        steps = max(steps, trainer_steps(run_dir, POLICY))
        ledger = (build(run_dir, settings_of(run_dir, env), [POLICY]) if stalls
                  else drain(run_dir, proc, env, [POLICY], BATCH_GROUPS, timeout=900))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        out = finish(proc, 600)
    fired = sorted(p.name for p in (run_dir / "trainer" / POLICY).glob("failpoint-*"))
    problems = ledger.problems(BATCH_GROUPS, drained=not stalls)
    result = {"machine": os.uname().nodename, "cores": os.cpu_count(), "seed": args.seed,
              "faults": done, "trainer_failpoints_fired": fired, "steps": steps,
              "wall_minutes": (time.time() - started) / 60, "stalls": stalls,
              "recovery_s_p50": sorted(recoveries)[len(recoveries) // 2] if recoveries else None,
              "recovery_s_max": max(recoveries, default=None), "ledger": ledger.to_json(),
              "ledger_line": ledger.line(), "problems": problems,
              "left_running": [cmd[:120] for _, cmd in processes_of(run_dir)], "run_dir": str(run_dir)}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1), flush=True)
    if problems or stalls:
        print(out[-3000:])
    return 1 if problems or stalls else 0


if __name__ == "__main__":
    raise SystemExit(main())
