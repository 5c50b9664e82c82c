"""Synchronous RL against the dataflow, on the same workload for the same number of steps.

Baseline (`sync`): one process runs the loop a colocated synchronous RL system runs: generate a
batch of groups with the current weights (the workers' torch engine, environments and workflows),
compute GRPO advantages (the streams' estimator), take one optimiser step (the trainer's engine and
loss), copy the new weights into the engine, repeat. Nothing overlaps and nothing is stale.

Dataflow (`async`): `astraflow run` of the same recipe with max_staleness 1, 2 and 4: feeder,
workers, streams and trainer as separate processes on a local Kafka, generation overlapping training.

Both use the recipe's model, group size, batch and learning rate. Reported per mode: wall time of
steps 2..N (start-up excluded; the first step includes model loading), total wall time, the ratio
of the sync time to each async time, and the mean reward of the last 10 steps.

    python -m bench.e2e_sync_vs_async [--recipe recipes/guess_number.yaml] [--steps 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
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
from bench.machine import describe
from streams.advantages import grpo
from trainer.engine import Engine, collate
from workers.engines.torch_engine import TorchEngine
from workers.envs.base import Codec, load_tokenizer
from workers.episodes import Runtime, run_episode
from workers.feeder import generated_tasks

REPO = Path(__file__).resolve().parent.parent


def samples_of(group: list[Trajectory], policy: str) -> list[Sample]:
    """The streams stage in miniature: GRPO over the group's rewards, one Sample per trajectory."""
    rewards = np.array([t.rewards[policy] for t in group], np.float32)
    adv, mean, std = grpo(rewards)
    out = []
    for t, a in zip(group, adv, strict=True):
        mask = t.policy_mask(policy)
        out.append(Sample(policy=policy, traj_id=t.traj_id, group_id=t.group_id, task_id=t.task_id, env=t.env,
                          tokens=t.tokens, loss_mask=mask.astype(np.uint8), logprobs=t.logprobs, versions=t.versions,
                          advantages=np.where(mask, a, 0).astype(np.float32), reward=t.rewards[policy],
                          group_size=len(group), group_samples=len(group), group_mean=mean, group_std=std))
    return out


async def sync_run(recipe: Recipe, steps: int, work: Path) -> dict[str, Any]:
    policy = recipe.policy_names[0]
    init = init_checkpoint(recipe.model_for(policy), work / "init")
    codec = Codec(load_tokenizer(init))
    runtime = Runtime(recipe, codec)
    engine = TorchEngine(policy, str(init), max_batch=recipe.worker.max_episodes)
    trainer = Engine(load_model(init), recipe.trainer, torch.device("cpu"), pad_id=codec.pad,
                     sampling=SamplingSettings.of(recipe.worker))
    tasks = generated_tasks(recipe)
    times, rewards = [], []
    start = time.perf_counter()
    for step in range(1, steps + 1):
        batch = [next(tasks) for _ in range(recipe.trainer.batch_groups)]
        episodes = [run_episode(runtime, task, k, {policy: engine}, "sync", "local")
                    for task in batch for k in range(task.group_size)]
        results = await asyncio.gather(*episodes)  # generate (the engine batches the episodes)
        by_group: dict[str, list[Trajectory]] = {}
        for trajs, _ in results:
            for t in trajs:
                by_group.setdefault(t.group_id, []).append(t)
        samples = [s for group in by_group.values() for s in samples_of(group, policy)]
        rows = collate(samples, codec.pad)  # train
        n_tokens = float(sum(float(s.loss_mask.sum()) for s in samples))
        trainer.step(rows, step, n_tokens, float(len(samples)))
        state = {k: v.detach().to(torch.bfloat16) for k, v in trainer.model.state_dict().items()}
        await engine.update_weights(state, step)  # sync weights before the next generation
        trainer.serving_published = True  # the engine now runs bfloat16-published weights
        rewards.append(float(np.mean([s.reward for s in samples])))
        times.append(time.perf_counter())
    await engine.close()
    await runtime.close()
    return {"total_s": times[-1] - start, "steps_s": times[-1] - times[0], "rewards": rewards}


def async_run(recipe_path: Path, staleness: int, steps: int, work: Path) -> dict[str, Any]:
    data = yaml.safe_load(recipe_path.read_text())
    data["max_staleness"] = staleness
    recipe_file = work / f"recipe-s{staleness}.yaml"
    recipe_file.write_text(yaml.safe_dump(data))
    run_dir = work / f"run-s{staleness}"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "astraflow.cli", "run", str(recipe_file), "--run-dir", str(run_dir),
                    "--max-steps", str(steps), "--no-dashboard"], check=True, cwd=REPO,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    total = time.perf_counter() - start
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    by_step = {r["step"]: r for r in rows if r["component"] == "trainer" and r["step"] >= 1}
    ordered = [by_step[s] for s in sorted(by_step)][:steps]
    return {"total_s": total, "steps_s": ordered[-1]["time"] - ordered[0]["time"],
            "rewards": [r["values"].get("reward.mean", float("nan")) for r in ordered],
            "staleness": float(np.mean([r["values"].get("staleness.mean", 0.0) for r in ordered])),
            "stale_dropped": ordered[-1]["values"].get("samples.stale", 0.0)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "guess_number.yaml")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--staleness", type=int, nargs="*", default=[1, 2, 4])
    args = parser.parse_args()
    recipe = load_recipe(args.recipe)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        results["sync"] = asyncio.run(sync_run(recipe, args.steps, work))
        for s in args.staleness:
            results[f"async s={s}"] = async_run(args.recipe, s, args.steps, work)
    print(f"machine: {describe()}")
    print(f"workload: {recipe.name}, {args.steps} steps of {recipe.trainer.batch_groups} groups x "
          f"{recipe.feeder.group_size}; async with {recipe.worker.count} workers")
    base = results["sync"]["steps_s"]
    print(f"{'mode':12s} {'steps 2..N s':>13s} {'total s':>9s} {'sync/this':>10s} {'reward last 10':>15s} "
          f"{'mean lag':>9s}")
    for mode, r in results.items():
        last = [x for x in r["rewards"][-10:] if x == x]
        print(f"{mode:12s} {r['steps_s']:13.1f} {r['total_s']:9.1f} {base / r['steps_s']:10.2f} "
              f"{(sum(last) / len(last) if last else float('nan')):15.3f} {r.get('staleness', 0.0):9.2f}")


if __name__ == "__main__":
    main()
