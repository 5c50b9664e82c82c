"""FIFO vs earliest-deadline-first batches (`trainer.order`, trainer/batching.py).

Two measurements:
- runs (default): `astraflow run` of one recipe per order over the same seeds (bench/variants.py):
  stale drops, the lag distribution of trained samples and reward. Reordering matters only where
  the queue holds groups of several versions, so the default recipe has max_staleness 2 and two
  workers (multi-turn episodes of different lengths).
- `--simulate`: the trainer's own GroupBuffer fed by a model of a queue without admission control
  (no Kafka, no model, milliseconds): each step `batch_groups` groups arrive on average (0 to twice
  that, uniformly), each rolled out `d` versions ago with d = 0, 1, 2, 3 at 50/30/15/5% (workers of
  different speeds); one batch per step and a new version per batch that trained anything (as the
  trainer). Arrivals match consumption on average, so a backlog builds and drains at random.

    python -m bench.batch_order [RECIPE] [--values fifo,edf] [--seeds 2] [--steps 80] [--bootstrap HOST:PORT]
    python -m bench.batch_order --simulate [--seeds 5]
"""

from __future__ import annotations

import random
import sys

import numpy as np

from bench.variants import cli
from trainer.batching import ORDERS, Order

DELAYS = ((0, 0.5), (1, 0.3), (2, 0.15), (3, 0.05))


def simulate(
    order: Order,
    seed: int,
    steps: int = 500,
    batch_groups: int = 8,
    group_size: int = 4,
    max_staleness: int = 2,
) -> dict[str, float]:
    """Stale share and mean lag of trained samples in the queue model of the module docstring."""
    from astraflow.records import Sample, group_id, traj_id
    from trainer.batching import GroupBuffer

    rng = random.Random(seed)
    buf = GroupBuffer("p", order=order)
    version = offset = n = 0
    lags: list[int] = []
    for _ in range(steps):
        for _ in range(rng.randint(0, 2 * batch_groups)):
            v = max(0, version - rng.choices([d for d, _ in DELAYS], [w for _, w in DELAYS])[0])
            task, n = f"t{n}", n + 1
            for i in range(group_size):
                sample = Sample(
                    policy="p",
                    traj_id=traj_id(task, 0, i),
                    group_id=group_id(task, 0),
                    task_id=task,
                    env="sim",
                    tokens=np.arange(4, dtype=np.int32),
                    loss_mask=np.ones(4, np.uint8),
                    logprobs=np.zeros(4, np.float32),
                    versions=np.full(4, v, np.int32),
                    advantages=np.zeros(4, np.float32),
                    group_size=group_size,
                    group_samples=group_size,
                )
                buf.add(sample, 0, offset)
                offset += 1
        batch = buf.take(batch_groups, None, version, max_staleness)
        if batch is not None:
            buf.done(batch, version)
            lags += batch.lags
            version += bool(batch.samples)  # as the trainer: a wholly stale batch trains nothing
    trained, stale = len(lags), buf.counts["samples.stale"]
    return {
        "stale_share": stale / max(trained + stale, 1),
        "lag_mean": sum(lags) / max(trained, 1),
        "versions": float(version),
        "queued_groups": float(len(buf.ready)),
    }


def simulate_cli(seeds: int) -> None:
    print("| order | seed | stale share | mean lag of trained | versions | groups left queued |")
    print("|---|---:|---:|---:|---:|---:|")
    for seed in range(seeds):
        for order in ORDERS:
            r = simulate(order, seed)
            print(
                f"| {order} | {seed} | {r['stale_share']:.1%} | {r['lag_mean']:.2f} | {r['versions']:.0f} | "
                f"{r['queued_groups']:.0f} |"
            )


if __name__ == "__main__":
    if "--simulate" in sys.argv:
        seeds = sys.argv[sys.argv.index("--seeds") + 1] if "--seeds" in sys.argv else "5"
        simulate_cli(int(seeds))
    else:
        cli(recipe="guess_number", key="trainer.order", values="fifo,edf", name="batch_order")
