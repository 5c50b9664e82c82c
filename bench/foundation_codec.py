"""Codec throughput for a 1,024-token trajectory: records/s and MB/s for encode and decode
(validation included), as ratios against two baselines in the same process: JSON with lists of
numbers (what a naive system ships) and msgpack with lists (no packed buffers, no validation).

    python bench/foundation_codec.py [--seconds 2]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import msgpack
import numpy as np

from astraflow.records import Trajectory, decode, encode
from bench.machine import describe


def trajectory(n: int = 1024) -> Trajectory:
    rng = np.random.default_rng(0)
    owner = np.where(np.arange(n) < 64, -1, 0).astype(np.int8)
    return Trajectory(
        traj_id="task-000001#0#3",
        group_id="task-000001#0",
        task_id="task-000001",
        env="arithmetic",
        policies=["solver"],
        tokens=rng.integers(0, 32000, n, dtype=np.int32),
        owner=owner,
        logprobs=np.where(owner >= 0, -rng.random(n, dtype=np.float32), 0).astype(np.float32),
        versions=np.where(owner >= 0, 7, -1).astype(np.int32),
        rewards={"solver": 1.0},
        group_size=8,
        sample_index=3,
        worker_id="w1",
        region="eu",
        timings={"generate_s": 1.5},
    )


def rate(fn: Callable[[], object], seconds: float) -> float:
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(50):
            fn()
        n += 50
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    traj = trajectory()
    data = encode(traj)
    as_lists = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in traj.to_dict().items()}
    js = json.dumps(as_lists).encode()
    mp = msgpack.packb(as_lists)
    rows = {
        "astraflow encode": (rate(lambda: encode(traj), args.seconds), len(data)),
        "astraflow decode": (rate(lambda: decode(data, Trajectory), args.seconds), len(data)),
        "json encode (lists)": (rate(lambda: json.dumps(as_lists).encode(), args.seconds), len(js)),
        "json decode (lists)": (rate(lambda: json.loads(js), args.seconds), len(js)),
        "msgpack encode (lists)": (rate(lambda: msgpack.packb(as_lists), args.seconds), len(mp)),
        "msgpack decode (lists)": (rate(lambda: msgpack.unpackb(mp), args.seconds), len(mp)),
    }
    print(f"machine: {describe()}")
    print(
        f"record: Trajectory of 1,024 tokens; astraflow {len(data)} B, json {len(js)} B, "
        f"msgpack-lists {len(mp)} B"
    )
    print(f"{'':26s} {'records/s':>12s} {'MB/s':>8s}")
    for name, (r, size) in rows.items():
        print(f"{name:26s} {r:12,.0f} {r * size / 1e6:8.1f}")
    for op in ("encode", "decode"):
        ours = rows[f"astraflow {op}"][0]
        print(
            f"{op}: {ours / rows[f'json {op} (lists)'][0]:.1f}x json, "
            f"{ours / rows[f'msgpack {op} (lists)'][0]:.1f}x msgpack-with-lists (records/s ratio)"
        )


if __name__ == "__main__":
    main()
