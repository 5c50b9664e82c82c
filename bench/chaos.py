"""`make chaos`: the long fault-injection run. One run directory of recipes/arithmetic.yaml (tiny
model) on a broker of its own that this script starts, in `--rounds` rounds. In each round: a new
`astraflow run` resumes the run directory; each component kind (worker, streams, trainer, feeder)
is SIGKILLed once, once the trainer took a step, in a shuffled order a few seconds apart; the
trainer must then advance a step within `--stall-s` seconds (else: a stall); then the supervisor is
SIGKILLed (its components get SIGTERM) and the next round resumes. In `--broker-restarts` rounds the
broker is SIGKILLed too, while every client runs, and started again on its data directory and port.
The trainer is also killed at its failpoints (mid-step, mid-checkpoint, mid-publication). At the end
the run is drained and its ledger taken (astraflow/runner/ledger.py): lost, duplicated, stalls.
(Rounds rather than one fault at a time: on the 2-core machine a restart costs a minute or more.)

    PYTHONPATH=. python -m bench.chaos [--rounds 10] [--seed 0] [--out bench/chaos-result.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import tempfile
import time
from pathlib import Path

from astraflow import broker
from astraflow.runner.ledger import build
from tests.conftest import REPO, subprocess_env
from tests.e2e.helpers import processes_of, trainer_steps
from tests.faults.harness import (
    BATCH_GROUPS,
    KINDS,
    component_pids,
    drain,
    fault_recipe,
    kill_broker,
    kill_component,
    restart_broker,
    settings_of,
    start_run,
    stop,
    wait_steps,
)

POLICY = "solver"
TRAINER_FAILPOINTS = (
    "mid_step:4,mid_checkpoint:9,mid_publication:14,mid_step:19,mid_checkpoint:25,mid_publication:31"
)


def supervisor_kill(proc: subprocess.Popen[str], run_dir: Path) -> None:
    proc.kill()
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 120  # its components get SIGTERM (PR_SET_PDEATHSIG) and stop
    while any(component_pids(run_dir, k) for k in KINDS) and time.monotonic() < deadline:
        time.sleep(0.5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--broker-restarts", type=int, default=2)
    ap.add_argument("--stall-s", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "chaos-result.json")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="astraflow-chaos-"))
    run_dir, broker_dir = root / "run", root / "broker"
    recipe = fault_recipe(root / "arithmetic.yaml", workers=args.workers)
    bootstrap = broker.start(port=0, data_dir=broker_dir).bootstrap
    env = subprocess_env(
        ASTRAFLOW_BOOTSTRAP=bootstrap,
        ASTRAFLOW_NAMESPACE="chaos",
        ASTRAFLOW_TRAINER_FAILPOINT=TRAINER_FAILPOINTS,
    )
    broker_rounds = {(i + 1) * args.rounds // (args.broker_restarts + 1) for i in range(args.broker_restarts)}
    done: dict[str, int] = {}
    stalls: list[str] = []
    recoveries: list[float] = []
    started = time.time()
    steps = 0  # metrics.jsonl starts again empty at each resume: the highest step seen so far
    print(
        f"[chaos] {args.rounds} rounds, broker restarts in rounds {sorted(broker_rounds)}, run dir {run_dir}",
        flush=True,
    )
    proc = start_run(recipe, run_dir, env)
    ledger = None
    try:
        for rnd in range(args.rounds):
            steps = max(steps, trainer_steps(run_dir, POLICY))
            try:  # every component is up and working before the faults
                wait_steps(run_dir, POLICY, steps + 1, proc, args.stall_s)
            except AssertionError as exc:
                stalls.append(f"round {rnd}, before its faults: {exc}")
                break
            kinds = list(KINDS) + (["broker"] if rnd in broker_rounds else [])
            rng.shuffle(kinds)
            for kind in kinds:
                if kind == "broker":
                    kill_broker(broker_dir)
                    time.sleep(5)  # every client notices
                    assert restart_broker(broker_dir) == bootstrap
                else:
                    kill_component(run_dir, kind, timeout=args.stall_s)
                done[kind] = done.get(kind, 0) + 1
                time.sleep(rng.uniform(1.0, 6.0))
            steps = max(steps, trainer_steps(run_dir, POLICY))
            try:
                recoveries.append(wait_steps(run_dir, POLICY, steps + 1, proc, args.stall_s))
            except AssertionError as exc:
                stalls.append(f"round {rnd}: {exc}")
                print(f"[chaos] STALL {stalls[-1][:2000]}", flush=True)
                break
            steps = max(steps, trainer_steps(run_dir, POLICY))
            print(
                f"[chaos] {time.time() - started:6.0f}s round {rnd + 1}/{args.rounds}: "
                f"killed {', '.join(kinds)}; step {steps} after {recoveries[-1]:.0f}s",
                flush=True,
            )
            supervisor_kill(proc, run_dir)  # after the last round too: the drain runs on a resume
            done["supervisor"] = done.get("supervisor", 0) + 1
            proc = start_run(recipe, run_dir, env)
        if not stalls:  # a last stretch without faults, then the drain
            wait_steps(run_dir, POLICY, steps + 3, proc, args.stall_s)
            steps = max(steps, trainer_steps(run_dir, POLICY))
            ledger = drain(run_dir, proc, env, [POLICY], BATCH_GROUPS, timeout=900)
        else:
            ledger = build(run_dir, settings_of(run_dir, env), [POLICY])
    finally:
        out = stop(proc, 600)
        broker.stop(broker_dir)
    fired = sorted(p.name for p in (run_dir / "trainer" / POLICY).glob("failpoint-*"))
    problems = ledger.problems(BATCH_GROUPS, drained=not stalls)
    result = {
        "machine": os.uname().nodename,
        "cores": os.cpu_count(),
        "seed": args.seed,
        "faults": done,
        "trainer_failpoints_fired": fired,
        "steps": steps,
        "wall_minutes": (time.time() - started) / 60,
        "stalls": stalls,
        "recovery_s_p50": sorted(recoveries)[len(recoveries) // 2] if recoveries else None,
        "recovery_s_max": max(recoveries, default=None),
        "ledger": ledger.to_json(),
        "ledger_line": ledger.line(),
        "problems": problems,
        "left_running": [cmd[:120] for _, cmd in processes_of(run_dir)],
        "run_dir": str(run_dir),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1), flush=True)
    if problems or stalls:
        print(out[-3000:])
    return 1 if problems or stalls else 0


if __name__ == "__main__":
    raise SystemExit(main())
