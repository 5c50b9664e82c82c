"""Where a step of the dataflow goes: the loop's stages, timed from the records themselves.

Runs `astraflow run` of a recipe on a broker this bench starts, then reads back every topic and the
trainer's ledger and follows each group around the loop:

    feeder admits (task record)  -> worker starts the episodes (task time + Trajectory.timings.queue_s)
    -> episodes done, trajectories produced -> streams: last Sample of the group produced
    -> trainer forms the batch holding the group (ledger `formed`) -> step done (ledger `time`)
    -> WeightVersion event of that step -> feeder admits the next task

Timestamps are the broker's record timestamps (producer create time) and the wall times the
components stamp on records, all from one machine's clock. Prints the median and p90 of every stage
per group, the trainer's step interval, and how long the feeder took to answer a new version while
it was blocked; then the CPU a step of every component, the broker's included, and the machine's
idle cores a step, between steps N/5 and 4N/5 (bench/proc_cpu.py): on a machine the run keeps
busy, the step's wall time is their sum over the cores. Default workload: the full single-digit
addition task of the TRL comparison (arithmetic, 0..9 + 0..9, answer then <eos>).

    python -m bench.loop_breakdown [--recipe recipes/arithmetic.yaml] [--steps 200] [--set key=value ...]
                                   [--baseline CHECKOUT]
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import yaml

from astraflow import broker
from astraflow.config import KafkaSettings, load_recipe
from astraflow.kafka import read_to_end
from astraflow.records import Sample, SampleBatch, Task, WeightVersion, trajectories_of
from bench import proc_cpu
from bench.learning_seeds import run_command
from bench.machine import describe
from bench.proc_cpu import StepCpu

REPO = Path(__file__).resolve().parent.parent
FULL_ADDITION = {"feeder.env_args": {"max_operand": 9, "require_eos": True}}


def override(data: dict[str, Any], dotted: str, value: Any) -> None:
    *path, last = dotted.split(".")
    for key in path:
        data = data.setdefault(key, {})
    data[last] = value


def quantiles(xs: list[float]) -> str:
    if not xs:
        return "      -        -"
    xs = sorted(xs)
    p90 = xs[min(len(xs) - 1, int(0.9 * len(xs)))]
    return f"{1000 * statistics.median(xs):7.1f} {1000 * p90:8.1f}"


def run_once(
    recipe_file: Path,
    steps: int,
    run_dir: Path,
    bootstrap: str,
    policy: str,
    code: Path = REPO,
    broker_pid: int | None = None,
) -> tuple[float, StepCpu | None]:
    """`astraflow run` of the checkout at `code` (its own package first on the path): its wall
    seconds, and the CPU of each component a step between steps N/5 and 4N/5, `policy`'s trainer
    counting them (the broker's too, given its pid; None if the run ended before)."""
    env = {**os.environ, "ASTRAFLOW_BOOTSTRAP": bootstrap, "PYTHONPATH": str(code)}
    extra = {broker_pid: "broker"} if broker_pid else None
    return proc_cpu.measured_run(
        run_command(recipe_file, run_dir, steps), run_dir, policy, steps, code, env, extra
    )


def breakdown(settings: KafkaSettings, run_dir: Path, policy: str) -> dict[str, list[float]]:
    """Per-group stage durations (seconds) and per-step intervals, from the topics and the ledger."""
    tasks = {r.group_id: ts for ts, r in read_to_end(settings, "tasks") if isinstance(r, Task)}
    started: dict[str, float] = {}
    produced: dict[str, float] = {}
    for ts, record in read_to_end(settings, "trajectories"):
        for r in trajectories_of(record):
            start = r.created_at - r.timings.get("episode_s", 0.0)
            started[r.group_id] = min(started.get(r.group_id, start), start)
            produced[r.group_id] = max(produced.get(r.group_id, 0.0), ts)
    sampled: dict[str, float] = {}
    for ts, r in read_to_end(settings, f"samples.{policy}"):
        if isinstance(r, (Sample, SampleBatch)):
            sampled[r.group_id] = max(sampled.get(r.group_id, 0.0), ts)
    versions = sorted(
        (r.step, ts)
        for ts, r in read_to_end(settings, "weights")
        if isinstance(r, WeightVersion) and r.policy == policy and r.step > 0
    )
    published = dict(versions)
    ledger = [
        json.loads(line)
        for line in (run_dir / "trainer" / policy / "trained.jsonl").read_text().splitlines()
        if line.strip()
    ]
    if not ledger or "formed" not in ledger[0]:  # a checkout older than the timestamps: none of this
        return {}
    out: dict[str, list[float]] = {
        k: []
        for k in (
            "admitted -> episodes start",
            "episodes start -> last trajectory",
            "last trajectory -> last sample",
            "last sample -> batch formed",
            "batch formed -> step done",
            "step done -> weights event",
            "admitted -> trained",
            "step interval",
            "weights event -> next admission (blocked feeder)",
        )
    }
    for row in ledger:
        for g in row["groups"]:
            if not all(g in d for d in (tasks, started, produced, sampled)):
                continue
            out["admitted -> episodes start"].append(started[g] - tasks[g])
            out["episodes start -> last trajectory"].append(produced[g] - started[g])
            out["last trajectory -> last sample"].append(sampled[g] - produced[g])
            out["last sample -> batch formed"].append(row["formed"] - sampled[g])
            out["batch formed -> step done"].append(row["time"] - row["formed"])
            out["admitted -> trained"].append(row["time"] - tasks[g])
        if row["step"] in published:
            out["step done -> weights event"].append(published[row["step"]] - row["time"])
    times = [row["time"] for row in ledger]
    out["step interval"] = [b - a for a, b in zip(times, times[1:], strict=False)]
    # The feeder's reaction: for each version event, the first task admitted after it, counted only
    # when no task had been admitted in the 50 ms before the event (the feeder was waiting for it).
    admits = sorted(tasks.values())
    for _, ts in versions:
        i = bisect.bisect_left(admits, ts)
        if i < len(admits) and (i == 0 or ts - admits[i - 1] > 0.05):
            out["weights event -> next admission (blocked feeder)"].append(admits[i] - ts)
    return out


def measure(recipe_file: Path, steps: int, work: Path, code: Path) -> dict[str, Any]:
    """One run of `code` on a broker of its own; its stages, step intervals, reward and lag."""
    recipe = load_recipe(recipe_file)
    state = broker.start(port=0, data_dir=work / "kafka", quick_jit=True)  # as `astraflow run` starts its own
    try:
        run_dir = work / "run"
        wall, cpu = run_once(
            recipe_file, steps, run_dir, state.bootstrap, recipe.policy_names[0], code, state.pid
        )
        settings = KafkaSettings(bootstrap=state.bootstrap, namespace=recipe.name)  # as `run` names it
        stages = breakdown(settings, run_dir, recipe.policy_names[0])
        rows = [
            json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()
        ]
    finally:
        broker.stop(work / "kafka")
    trainer = sorted(
        (r for r in rows if r["component"] == "trainer" and r["step"] >= 1), key=lambda r: r["step"]
    )
    times = [r["time"] for r in trainer]
    stages["step interval (trainer metrics)"] = [b - a for a, b in zip(times, times[1:], strict=False)]
    tenth = max(1, len(trainer) // 10)
    reward = [r["values"].get("reward.mean", float("nan")) for r in trainer]
    lags = [r["values"].get("staleness.mean", 0.0) for r in trainer]
    return {
        "wall": wall,
        "steps_s": times[-1] - times[0],
        "steps": len(trainer),
        "stages": stages,
        "first": statistics.fmean(reward[:tenth]),
        "last": statistics.fmean(reward[-tenth:]),
        "lag": statistics.fmean(lags) if lags else 0.0,
        "cpu": cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "arithmetic.yaml")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="recipe overrides, YAML values (e.g. max_staleness=4)",
    )
    parser.add_argument("--no-full-addition", action="store_true", help="keep the recipe's own env_args")
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="CHECKOUT",
        help="also run this checkout of the project first (e.g. a `git worktree` of an "
        "older commit) and print both side by side",
    )
    parser.add_argument("--keep", type=Path, help="work in this directory and keep the runs there")
    args = parser.parse_args()
    data = yaml.safe_load(args.recipe.read_text())
    if not args.no_full_addition and "arithmetic" in args.recipe.name:
        for key, value in FULL_ADDITION.items():
            override(data, key, value)
    for item in args.set:
        key, _, value = item.partition("=")
        override(data, key, yaml.safe_load(value))
    codes = {"baseline": args.baseline.resolve()} if args.baseline else {}
    codes["this"] = REPO
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        recipe_file = work / "recipe.yaml"
        recipe_file.write_text(yaml.safe_dump(data))
        recipe = load_recipe(recipe_file)
        for name, code in codes.items():
            results[name] = measure(recipe_file, args.steps, work / name, code)
    print(f"machine: {describe()}")
    print(
        f"workload: {recipe.name} {json.dumps(data.get('feeder', {}).get('env_args', {}))}, "
        f"{args.steps} steps of {recipe.trainer.batch_groups} groups x {recipe.feeder.group_size}, "
        f"max_staleness {recipe.max_staleness}, {recipe.worker.count} workers; overrides {args.set}; runs: "
        + ", ".join(f"{n} = {c}" for n, c in codes.items())
    )
    print(
        f"{'run':10s} {'wall s':>7s} {'steps 2..N s':>13s} {'s/step':>7s} {'reward 1st 10%':>15s} "
        f"{'last 10%':>9s} {'mean lag':>9s}"
    )
    for name, r in results.items():
        print(
            f"{name:10s} {r['wall']:7.1f} {r['steps_s']:13.1f} {r['steps_s'] / max(1, r['steps'] - 1):7.3f} "
            f"{r['first']:15.3f} {r['last']:9.3f} {r['lag']:9.2f}"
        )
    if "baseline" in results:
        print(
            f"speed of this / baseline (steps 2..N): "
            f"{results['baseline']['steps_s'] / results['this']['steps_s']:.2f}x"
        )
    names = list(results)
    print(f"{'stage (p50 / p90 ms)':52s} " + " ".join(f"{n:>17s}" for n in names))
    for stage in results["this"]["stages"]:
        cells = []
        for n in names:
            xs = results[n]["stages"].get(stage, [])
            cells.append(f"{quantiles(xs):>17s}")
        print(f"{stage:52s} " + " ".join(cells))
    print_cpu(results)


def print_cpu(results: dict[str, dict[str, Any]]) -> None:
    """CPU ms a step of each component (all its threads; /proc), the machine's idle ms a step."""
    cpus = {n: r["cpu"] for n, r in results.items() if r["cpu"] is not None}
    if not cpus:
        print("CPU a step: the runs ended before their measuring window")
        return
    window = ", ".join(f"{n} steps {c.first}..{c.last}" for n, c in cpus.items())
    print(f"{'CPU ms a step (' + window + ')':52s} " + " ".join(f"{n:>17s}" for n in cpus))
    kinds = list(dict.fromkeys(k for c in cpus.values() for k in c.by_kind))
    rows = [(k, lambda c, k=k: c.by_kind.get(k, 0.0)) for k in kinds] + [
        ("all components", lambda c: c.total_ms),
        ("idle cores (machine)", lambda c: c.idle_ms),
        ("wall", lambda c: c.wall_ms),
    ]
    for label, value in rows:
        print(f"{label:52s} " + " ".join(f"{value(c):17.1f}" for c in cpus.values()))


if __name__ == "__main__":
    main()
