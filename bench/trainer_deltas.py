"""Sparse weight deltas on the tiny model: how small a delta is against the full snapshot (the
baseline, measured in the same run), and what fraction of bf16 elements an RL step changes, at
learning rates 1e-6, 1e-5 and 1e-4. Also checks that a chain of 10 deltas applied to the snapshot
rebuilds the trainer's weights bit for bit.

Each step is a real trainer step (trainer.engine: clipped policy-gradient loss, AdamW, gradient
clipping, float32 master weights) on synthetic groups with group-normalised advantages; each
version goes through the real WeightStore (zstd level 3) exactly as the trainer publishes it.

    python -m bench.trainer_deltas [--steps 20] [--groups 8]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import zlib

import numpy as np
import torch

from astraflow.config import ModelSpec
from astraflow.config.trainer import TrainerConfig
from astraflow.models import build_model
from astraflow.records import Sample, group_id, traj_id
from astraflow.weights import WeightStore, fetch_weights
from astraflow.weights import format as fmt
from bench.machine import describe
from trainer.engine import TrainEngine
from trainer.rows import collate

VOCAB = 98


def synthetic_batch(step: int, groups: int, size: int = 8, seed: int = 0) -> list[Sample]:
    """`groups` groups of `size` samples: a 6-token prompt and a 20-40-token completion, behaviour
    log-probs near the model's, group-normalised 0/1 rewards as advantages."""
    rng = np.random.default_rng([seed, step, zlib.crc32(b"bench")])
    out = []
    for g in range(groups):
        task = f"s{step}g{g}"
        rewards = rng.integers(0, 2, size).astype(np.float32)
        adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        for i in range(size):
            n = 6 + int(rng.integers(20, 41))
            tokens = np.concatenate([[1], rng.integers(4, VOCAB, n - 1)]).astype(np.int32)
            mask = (np.arange(n) >= 6).astype(np.uint8)
            out.append(
                Sample(
                    policy="p",
                    traj_id=traj_id(task, 0, i),
                    group_id=group_id(task, 0),
                    task_id=task,
                    env="bench",
                    tokens=tokens,
                    loss_mask=mask,
                    logprobs=np.where(mask, -np.log(VOCAB) + rng.normal(0, 0.05, n), 0)
                    .clip(max=0)
                    .astype(np.float32),
                    versions=np.where(mask, step, -1).astype(np.int32),
                    advantages=(mask * adv[i]).astype(np.float32),
                    group_size=size,
                    group_samples=size,
                )
            )
    return out


def run_lr(lr: float, steps: int, groups: int) -> dict[str, float]:
    spec = ModelSpec()
    engine = TrainEngine(
        build_model(spec), TrainerConfig(lr=lr, micro_batch_tokens=1 << 16), torch.device("cpu")
    )
    with tempfile.TemporaryDirectory() as root:
        store = WeightStore(root, "p", snapshot_every=10_000, keep_versions=steps + 2)
        events = [store.publish(engine.state_dict(), 0)]
        raw_sizes = []
        for step in range(1, steps + 1):
            rows = collate(synthetic_batch(step, groups), pad_id=0)
            engine.step(rows, step, float(rows.mask.sum()), float(len(rows)))
            events.append(store.publish(engine.state_dict(), step, step=step))
            path = store.objects / events[-1].delta_uri.rsplit("/", 1)[1]
            raw_sizes.append(len(fmt.decompress(path.read_bytes())))
        # rebuild the last version from the snapshot plus the chain of the last 10 deltas
        start = max(steps - 10, 0)
        held = fetch_weights(events[start], None)
        t0 = time.perf_counter()
        rebuilt = fetch_weights(events[-1], held)
        apply_s = time.perf_counter() - t0
        expected = {k: v.to(torch.bfloat16) for k, v in engine.state_dict().items()}
        unique, _ = fmt.split_aliases(expected)
        bit_identical = fmt.state_digest({k: rebuilt.state[k] for k in unique}) == fmt.state_digest(unique)
    snap = events[0].snapshot_bytes
    changed = [e.changed_fraction for e in events[1:]]
    zst = [e.delta_bytes / snap for e in events[1:]]
    raw = [r / snap for r in raw_sizes]
    return {
        "lr": lr,
        "params": sum(t.numel() for t in unique.values()),
        "snapshot": snap,
        "changed": statistics.mean(changed),
        "changed_min": min(changed),
        "changed_max": max(changed),
        "raw": statistics.mean(raw),
        "zst": statistics.mean(zst),
        "chain": min(10, steps),
        "bit_identical": bit_identical,
        "apply_ms": apply_s * 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--groups", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    results = [run_lr(lr, args.steps, args.groups) for lr in (1e-6, 1e-5, 1e-4)]
    r0 = results[0]
    print(f"Machine: {describe()}")
    print(
        f"Tiny Qwen2 (hidden 128, 4 layers), {r0['params']:,} unique bf16 elements, "
        f"snapshot {r0['snapshot']:,} B; {args.steps} steps of {args.groups} groups x 8 samples "
        f"per learning rate.\n"
    )
    print(
        "| lr | elements unchanged per step (min-max) | delta / snapshot, raw | delta / snapshot, zstd-3 "
        "| compression (zstd) | 10-delta chain bit-identical |"
    )
    print("|---|---:|---:|---:|---:|---|")
    for r in results:
        print(
            f"| {r['lr']:.0e} | {1 - r['changed']:.4f} "
            f"({1 - r['changed_max']:.4f}-{1 - r['changed_min']:.4f}) "
            f"| {r['raw']:.4f} | {r['zst']:.4f} | {1 / r['zst']:.1f}x | "
            f"{'yes' if r['bit_identical'] else 'NO'} ({r['chain']} deltas, {r['apply_ms']:.0f} ms) |"
        )
    if not all(r["bit_identical"] for r in results):
        raise SystemExit("a rebuilt model differs from the published weights")


if __name__ == "__main__":
    main()
