"""Synchronous RL against the dataflow, on the same workload for the same number of steps.

Baseline (`sync`): one process runs the loop a colocated synchronous RL system runs: generate a
batch of groups with the current weights (the workers' torch engine, environments and workflows),
compute GRPO advantages (the streams' estimator), take one optimiser step (the trainer's engine and
loss), copy the new weights into the engine, repeat. Nothing overlaps and nothing is stale.

Dataflow (`async`): `astraflow run` of the same recipe with max_staleness 1, 2 and 4: feeder,
workers, streams and trainer as separate processes on a local Kafka, generation overlapping training.

Both use the recipe's model, group size, batch and learning rate. Reported per mode: wall time of
steps 2..N (start-up excluded; the first step includes model loading), total wall time, the ratio
of the sync time to each async time, and the mean reward of the last 10 steps. Then where the CPU
of a step went: the sync loop's phases (generate, train, weights), and each dataflow run's
components with its broker and the cores it left idle (bench/proc_cpu.py).

The baseline runs at each of `--sync-threads` torch threads (default 1 and 2) and the ratios are
against the fastest: on the 2-core machine one thread ran guess_number's synchronous loop 14% faster
than torch's default of two (114-118 against 135-138 ms a step; its matrices are too small to split).

    python -m bench.e2e_sync_vs_async [--recipe recipes/guess_number.yaml] [--steps 60]
                                      [--sync-threads 1 2] [--tool-latency MEDIAN_S SIGMA]
                                      [--rounds 1]

`--rounds K` runs the whole comparison K times in turn (sync loop, then dataflow, again), and ends
with each dataflow mode's ratio round by round, their median and range: on a host whose speed
drifts by several percent from one minute to the next, one pair of runs cannot tell parity from a
few percent either way.

`--tool-latency` gives every environment step of both modes a lognormal delay (`worker.tool_latency`):
the long-tail agentic workload, where a synchronous step waits for its slowest episode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from astraflow.config import Recipe, load_recipe
from astraflow.models import init_checkpoint, load_model
from astraflow.records import Sample, Trajectory
from astraflow.sampling import SamplingSettings
from bench import proc_cpu
from bench.learning_seeds import run_command
from bench.machine import describe
from streams.advantages import grpo
from streams.api import Group
from streams.route import route
from trainer.engine import TrainEngine
from trainer.rows import collate
from workers.engines.torch_engine import TorchEngine
from workers.envs.base import Codec, load_tokenizer
from workers.episodes import Runtime, run_episode
from workers.feeder import generated_tasks

REPO = Path(__file__).resolve().parent.parent


def samples_of(group: list[Trajectory], policy: str) -> list[Sample]:
    """The streams stage in miniature: GRPO over the group's rewards, then the streams' own route."""
    rewards = np.array([t.rewards[policy] for t in group], np.float32)
    adv, mean, std = grpo(rewards)
    first = group[0]
    return route(
        Group(
            group_id=first.group_id,
            task_id=first.task_id,
            env=first.env,
            policies=[policy],
            group_size=len(group),
            trajectories=group,
            advantages={policy: adv},
            stats={policy: (mean, std)},
        )
    )


async def sync_run(recipe: Recipe, steps: int, work: Path) -> dict[str, Any]:
    policy = recipe.policy_names[0]
    init = init_checkpoint(recipe.model_for(policy), work / "init")
    codec = Codec(load_tokenizer(init))
    runtime = Runtime(recipe, codec)
    engine = TorchEngine(policy, str(init), max_batch=recipe.worker.max_episodes)
    trainer = TrainEngine(
        load_model(init),
        recipe.trainer,
        torch.device("cpu"),
        pad_id=codec.pad,
        sampling=SamplingSettings.of(recipe.worker),
    )
    tasks = generated_tasks(recipe)
    times, rewards = [], []
    cpu = {"generate": 0.0, "train": 0.0, "weights": 0.0}  # CPU seconds of steps 2..N, by phase
    start = time.perf_counter()
    for step in range(1, steps + 1):
        c0 = time.process_time()
        batch = [next(tasks) for _ in range(recipe.trainer.batch_groups)]
        episodes = [
            run_episode(runtime, task, k, {policy: engine}, "sync", "local")
            for task in batch
            for k in range(task.group_size)
        ]
        results = await asyncio.gather(*episodes)  # generate (the engine batches the episodes)
        by_group: dict[str, list[Trajectory]] = {}
        for trajs, _ in results:
            for t in trajs:
                by_group.setdefault(t.group_id, []).append(t)
        c1 = time.process_time()
        samples = [s for group in by_group.values() for s in samples_of(group, policy)]
        rows = collate(samples, codec.pad)  # train
        n_tokens = float(sum(float(s.loss_mask.sum()) for s in samples))
        trainer.step(rows, step, n_tokens, float(len(samples)))
        c2 = time.process_time()
        state = {k: v.detach().to(torch.bfloat16) for k, v in trainer.model.state_dict().items()}
        await engine.update_weights(state, step)  # sync weights before the next generation
        trainer.serving_published = True  # the engine now runs bfloat16-published weights
        rewards.append(float(np.mean([s.reward for s in samples])))
        times.append(time.perf_counter())
        if step > 1:
            for phase, seconds in zip(cpu, (c1 - c0, c2 - c1, time.process_time() - c2), strict=True):
                cpu[phase] += seconds
    await engine.close()
    await runtime.close()
    return {
        "total_s": times[-1] - start,
        "steps_s": times[-1] - times[0],
        "rewards": rewards,
        "times": [t - times[0] for t in times],
        "cpu_ms": {k: 1000 * v / max(1, steps - 1) for k, v in cpu.items()},
    }


def async_run(recipe_path: Path, staleness: int, steps: int, work: Path) -> dict[str, Any]:
    data = yaml.safe_load(recipe_path.read_text())
    data["max_staleness"] = staleness
    recipe_file = work / f"recipe-s{staleness}.yaml"
    recipe_file.write_text(yaml.safe_dump(data))
    run_dir = work / f"run-s{staleness}"
    policy = load_recipe(recipe_file).policy_names[0]
    total, cpu = proc_cpu.measured_run(run_command(recipe_file, run_dir, steps), run_dir, policy, steps, REPO)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    by_step = {r["step"]: r for r in rows if r["component"] == "trainer" and r["step"] >= 1}
    ordered = [by_step[s] for s in sorted(by_step)][:steps]
    return {
        "total_s": total,
        "steps_s": ordered[-1]["time"] - ordered[0]["time"],
        "rewards": [r["values"].get("reward.mean", float("nan")) for r in ordered],
        "times": [r["time"] - ordered[0]["time"] for r in ordered],
        "staleness": float(np.mean([r["values"].get("staleness.mean", 0.0) for r in ordered])),
        "stale_dropped": ordered[-1]["values"].get("samples.stale", 0.0),
        "cpu": cpu,
    }


def time_to(result: dict[str, Any], target: float, window: int = 10) -> float | None:
    """Seconds after step 1 at which the mean reward of the last `window` steps first reaches `target`."""
    rewards, times = result["rewards"], result["times"]
    for i in range(window - 1, len(rewards)):
        if float(np.mean(rewards[i - window + 1 : i + 1])) >= target:
            return float(times[i])
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "guess_number.yaml")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--staleness", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument(
        "--sync-threads",
        type=int,
        nargs="+",
        default=[1, 2],
        help="torch threads of the synchronous loop, one run each; ratios are against the fastest",
    )
    parser.add_argument(
        "--async-steps",
        type=int,
        default=None,
        help="steps of the dataflow runs (default --steps): more, to reach the sync run's reward",
    )
    parser.add_argument(
        "--tool-latency",
        type=float,
        nargs=2,
        metavar=("MEDIAN_S", "SIGMA"),
        help="a lognormal delay for every environment step, in both modes",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the sync loop and then the dataflow this many times, alternating: each round's "
        "ratios come from runs minutes apart, and their median and spread say what a drifting "
        "host's single pair cannot",
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    rounds: list[dict[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        recipe_path = args.recipe
        if args.tool_latency:
            data = yaml.safe_load(args.recipe.read_text())
            data.setdefault("worker", {})["tool_latency"] = {
                "median_s": args.tool_latency[0],
                "sigma": args.tool_latency[1],
            }
            recipe_path = work / "recipe-latency.yaml"
            recipe_path.write_text(yaml.safe_dump(data))
        recipe = load_recipe(recipe_path)
        for i in range(args.rounds):
            rounds.append(run_round(args, recipe, recipe_path, work / f"round-{i + 1}"))
    print(f"machine: {describe()}")
    print(
        f"workload: {recipe.name}, {args.steps} steps of {recipe.trainer.batch_groups} groups x "
        f"{recipe.feeder.group_size}; async with {recipe.worker.count} workers"
    )
    lat = recipe.worker.tool_latency
    if lat.median_s > 0:
        p99 = min(lat.max_s, lat.median_s * math.exp(2.326 * lat.sigma))
        print(
            f"tool latency per environment step: lognormal, p50 {lat.median_s * 1000:.0f} ms, "
            f"p99 {p99 * 1000:.0f} ms (p99/p50 {p99 / lat.median_s:.1f}), mean "
            f"{lat.median_s * math.exp(lat.sigma**2 / 2) * 1000:.0f} ms"
        )
    for i, results in enumerate(rounds):
        if args.rounds > 1:
            print(f"round {i + 1} of {args.rounds}")
        report(results)
        print_cpu(results)
    if args.rounds > 1:
        print_rounds(rounds)


def run_round(
    args: argparse.Namespace, recipe: Recipe, recipe_path: Path, work: Path
) -> dict[str, dict[str, Any]]:
    """One run of the sync loop at each of `--sync-threads`, then one dataflow run at each staleness."""
    results: dict[str, dict[str, Any]] = {}
    work.mkdir(parents=True, exist_ok=True)
    default_threads = torch.get_num_threads()
    for n in args.sync_threads:
        torch.set_num_threads(n)
        results[f"sync {n}t"] = asyncio.run(sync_run(recipe, args.steps, work / f"sync-{n}"))
    torch.set_num_threads(default_threads)
    for s in args.staleness:
        results[f"async s={s}"] = async_run(recipe_path, s, args.async_steps or args.steps, work)
    return results


def fastest_sync(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The round's sync run with the shortest steps 2..N: the baseline of every ratio."""
    return min((r for mode, r in results.items() if mode.startswith("sync")), key=lambda r: r["steps_s"])


def per_step_ratios(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each mode's seconds a step against the fastest sync run's (> 1: faster than it)."""
    sync = fastest_sync(results)
    base = sync["steps_s"] / (len(sync["rewards"]) - 1)
    return {mode: base / (r["steps_s"] / (len(r["rewards"]) - 1)) for mode, r in results.items()}


def report(results: dict[str, dict[str, Any]]) -> None:
    """One round's table: each mode's steps, times, ratio a step, reward and time to equal reward."""
    sync = fastest_sync(results)
    ratios = per_step_ratios(results)
    # equal reward: the time each mode took (from step 1) until its last 10 steps averaged the reward
    # of the sync run's last 10 steps
    target = float(np.mean(sync["rewards"][-10:]))
    sync_to = time_to(sync, target)
    print(
        f"{'mode':12s} {'steps':>6s} {'steps 2..N s':>13s} {'total s':>9s} {'sync/this':>10s} "
        f"{'reward last 10':>15s} {'mean lag':>9s} {'s to target':>12s} {'sync/this':>10s}"
    )
    for mode, r in results.items():
        last = [x for x in r["rewards"][-10:] if x == x]
        reach = time_to(r, target)
        print(
            f"{mode:12s} {len(r['rewards']):6d} {r['steps_s']:13.1f} {r['total_s']:9.1f} "
            f"{ratios[mode]:10.2f} "
            f"{(sum(last) / len(last) if last else float('nan')):15.3f} {r.get('staleness', 0.0):9.2f} "
            f"{(f'{reach:.1f}' if reach is not None else 'never'):>12s} "
            f"{(f'{sync_to / reach:.2f}' if reach and sync_to else '-'):>10s}"
        )
    print(
        f"target: the fastest sync run's last-10-step reward, {target:.3f}; sync/this per step is the "
        "ratio of seconds a step to the fastest sync run's"
    )


def print_rounds(rounds: list[dict[str, dict[str, Any]]]) -> None:
    """Each dataflow mode's per-step ratio to its own round's fastest sync run, round by round, with
    the median and the range."""
    print("sync/this per step, round by round (each against its own round's fastest sync run):")
    for mode in rounds[0]:
        if mode.startswith("sync"):
            continue
        values = [per_step_ratios(results)[mode] for results in rounds]
        print(
            f"{mode:12s} {' '.join(f'{v:.2f}' for v in values)}; median {float(np.median(values)):.2f}, "
            f"range {min(values):.2f}-{max(values):.2f}"
        )


def print_cpu(results: dict[str, dict[str, Any]]) -> None:
    """Where each mode's CPU goes, in ms a step: the sync loop's phases (steps 2..N, its process),
    each dataflow run's components (steps N/5..4N/5, /proc; its broker included) and the cores it
    left idle."""
    for mode, r in results.items():
        if "cpu_ms" in r:
            phases = ", ".join(f"{k} {v:.1f}" for k, v in r["cpu_ms"].items())
            print(f"CPU ms a step, {mode}: {phases}; all {sum(r['cpu_ms'].values()):.1f}")
        elif r.get("cpu") is not None:
            c = r["cpu"]
            parts = ", ".join(f"{k} {v:.1f}" for k, v in c.by_kind.items())
            print(
                f"CPU ms a step, {mode} (steps {c.first}..{c.last}): {parts}; all {c.total_ms:.1f}, "
                f"idle cores {c.idle_ms:.1f}, wall {c.wall_ms:.1f}"
            )


if __name__ == "__main__":
    main()
