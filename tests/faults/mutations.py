"""The valid records and the mutations tests/faults/fuzzing.py builds its fuzzed records from:
each mutation breaks one thing a consumer must refuse, and names what its reason must say."""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from astraflow.records import (
    DeadLetter,
    Metric,
    Record,
    Sample,
    Task,
    TaskStats,
    Trajectory,
    WeightVersion,
    encode,
    group_id,
    traj_id,
)
from astraflow.records.fields import MAX_TOKENS

POLICY = "solver"
POLICIES = frozenset({POLICY})


# ------------------------------------------------------------------------------ valid bases


def valid_record(cls: type[Record], rng: random.Random) -> Record:
    """A valid record of `cls` as the run's components write them (random lengths)."""
    task = f"fuzz-task-{rng.randrange(10**6)}"
    n = rng.randint(2, 48)
    prompt = rng.randint(1, n - 1)
    versions = np.array([-1] * prompt + [rng.randint(0, 5)] * (n - prompt), np.int32)
    logprobs = np.array([0.0] * prompt + [-rng.random() for _ in range(n - prompt)], np.float32)
    tokens = np.array([rng.randrange(1000) for _ in range(n)], np.int32)
    if cls is Task:
        return Task(
            task_id=task,
            env="arithmetic",
            roles={"solver": POLICY},
            group_size=4,
            prompt="3+4=",
            seed=rng.randrange(1 << 30),
            payload={"answer": 7},
        )
    if cls is Trajectory:
        k = rng.randrange(4)
        return Trajectory(
            traj_id=traj_id(task, 0, k),
            group_id=group_id(task, 0),
            task_id=task,
            env="arithmetic",
            policies=[POLICY],
            tokens=tokens,
            owner=np.array([-1] * prompt + [0] * (n - prompt), np.int8),
            logprobs=logprobs,
            versions=versions,
            rewards={POLICY: float(rng.random() < 0.5)},
            group_size=4,
            sample_index=k,
            timings={"generate": 0.1},
        )
    if cls is Sample:
        return Sample(
            policy=POLICY,
            traj_id=traj_id(task, 0, 1),
            group_id=group_id(task, 0),
            task_id=task,
            env="arithmetic",
            tokens=tokens,
            loss_mask=(versions >= 0).astype(np.uint8),
            logprobs=logprobs,
            versions=versions,
            advantages=np.where(versions >= 0, 0.5, 0.0).astype(np.float32),
            reward=1.0,
            group_size=4,
            group_samples=4,
            group_mean=0.5,
            group_std=0.5,
        )
    if cls is WeightVersion:
        return WeightVersion(policy=POLICY, version=3, snapshot_version=3, snapshot_uri="file:///w/3")
    if cls is TaskStats:
        return TaskStats(
            task_id=task, env="arithmetic", groups=2, samples=8, mean_reward=0.5, success_rate=0.5
        )
    if cls is Metric:
        return Metric(component="worker", id="w0", values={"tokens_per_s": 10.0})
    return DeadLetter(
        source_topic="trajectories", partition=0, offset=1, error="bad", component="streams", raw=b"x"
    )


OTHER_TYPES = (Task, Trajectory, Sample, WeightVersion, TaskStats, Metric, DeadLetter)
_CODES = {"int8": 1, "uint8": 2, "int32": 3, "float32": 4}  # the codec's array extension (records/codec.py)


def packed(values: Any, dtype: str) -> msgpack.ExtType:
    """A token array as the codec packs it: dtype code, little-endian uint32 count, raw buffer."""
    arr = np.asarray(values, dtype=np.dtype(dtype).newbyteorder("<"))
    return msgpack.ExtType(1, struct.pack("<BI", _CODES[dtype], arr.shape[0]) + arr.tobytes())


def lying(dtype: str, count: int, nbytes: int) -> msgpack.ExtType:
    """An array extension whose header says `count` elements but carries `nbytes` bytes."""
    return msgpack.ExtType(1, struct.pack("<BI", _CODES[dtype], count) + bytes(nbytes))


def body_of(record: Record) -> dict[str, Any]:
    """The msgpack map of a valid record, its token arrays still packed extensions."""
    return msgpack.unpackb(encode(record), raw=False)


def pack(body: dict[str, Any]) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


# ------------------------------------------------------------------------------ mutations

NAN, INF = math.nan, math.inf
DROP = object()


class Several(dict[str, Any]):
    """A mutation of several fields at once (a policy renamed where it is named twice)."""


Mutation = tuple[str, Callable[[int], Any], str]  # field, new value (given the token count), the reason names

#: One field broken on purpose, per record type: (field, value given the token count n, what the
#: consumer's reason must name). DROP removes a required field; Several sets more than one.
TARGETED: dict[type[Record], list[Mutation]] = {
    Task: [
        ("group_size", lambda n: 0, "group_size"),
        ("group_size", lambda n: -3, "group_size"),
        ("group_size", lambda n: 2**40, "group_size"),
        ("group_size", lambda n: "4", "group_size"),
        ("group_size", lambda n: 2.5, "group_size"),
        ("group_size", lambda n: True, "group_size"),
        ("roles", lambda n: {"solver": "ghost"}, "unknown policy 'ghost'"),
        ("roles", lambda n: {}, "roles"),
        ("roles", lambda n: [POLICY], "roles"),
        ("env", lambda n: "9lives", "env"),
        ("env", lambda n: "", "env"),
        ("task_id", lambda n: "", "task_id"),
        ("task_id", lambda n: "x" * 300, "task_id"),
        ("task_id", lambda n: 7, "task_id"),
        ("task_id", lambda n: DROP, "task_id"),
        ("roles", lambda n: DROP, "roles"),
        ("seed", lambda n: -1, "seed"),
        ("seed", lambda n: 2**64 - 1, "seed"),
        ("created_at", lambda n: NAN, "created_at"),
        ("created_at", lambda n: INF, "created_at"),
        ("created_at", lambda n: -1.0, "created_at"),
        ("attempt", lambda n: -1, "attempt"),
        ("payload", lambda n: {"answer": NAN}, "payload.answer"),
        ("payload", lambda n: {"x": b"\x00"}, "payload.x"),
        ("min_versions", lambda n: {"ghost": 1}, "min_versions.ghost"),
        ("min_versions", lambda n: {POLICY: -1}, "min_versions.solver"),
        ("prompt", lambda n: 42, "prompt"),
    ],
    Trajectory: [
        ("rewards", lambda n: {POLICY: NAN}, "rewards.solver"),
        ("rewards", lambda n: {POLICY: INF}, "rewards.solver"),
        ("rewards", lambda n: {POLICY: -INF}, "rewards.solver"),
        ("rewards", lambda n: {}, "rewards"),
        ("rewards", lambda n: {POLICY: "1"}, "rewards.solver"),
        ("rewards", lambda n: DROP, "rewards"),
        ("policies", lambda n: Several(policies=["ghost"], rewards={"ghost": 1.0}), "unknown policy 'ghost'"),
        ("policies", lambda n: [], "policies"),
        ("tokens", lambda n: packed([-1] * n, "int32"), "tokens"),
        ("tokens", lambda n: list(range(n)), "tokens"),
        ("logprobs", lambda n: packed([NAN] * n, "float32"), "logprobs"),
        ("logprobs", lambda n: packed([0.5] * n, "float32"), "logprobs"),
        ("logprobs", lambda n: packed([-1.0] * (n - 1), "float32"), "logprobs"),
        ("versions", lambda n: packed([0] * (n + 7), "int32"), "versions"),
        ("owner", lambda n: packed([1] * n, "int8"), "owner"),
        ("owner", lambda n: packed([-2] * n, "int8"), "owner"),
        ("versions", lambda n: packed([-1] * n, "int32"), "versions"),
        ("tokens", lambda n: lying("int32", MAX_TOKENS + 1, 0), "exceeds"),
        ("tokens", lambda n: lying("int32", n, 4 * n + 3), "carries"),
        ("tokens", lambda n: lying("int32", 2**32 - 1, 0), "exceeds"),
        ("sample_index", lambda n: 4, "sample_index"),
        ("sample_index", lambda n: -1, "sample_index"),
        ("group_size", lambda n: 0, "group_size"),
        ("group_size", lambda n: 5000, "group_size"),
        ("finish_reason", lambda n: "exploded", "finish_reason"),
        ("timings", lambda n: {"generate": -1.0}, "timings"),
        ("traj_id", lambda n: DROP, "traj_id"),
        ("error", lambda n: "e" * 5000, "error"),
    ],
    Sample: [
        ("reward", lambda n: NAN, "reward"),
        ("reward", lambda n: INF, "reward"),
        ("reward", lambda n: "1", "reward"),
        ("policy", lambda n: "ghost", "unknown policy 'ghost'"),
        ("policy", lambda n: DROP, "policy"),
        ("loss_mask", lambda n: packed([2] * n, "uint8"), "loss_mask"),
        ("advantages", lambda n: packed([NAN] * n, "float32"), "advantages"),
        ("advantages", lambda n: packed([INF] * n, "float32"), "advantages"),
        ("advantages", lambda n: packed([0.0] * (n + 1), "float32"), "advantages"),
        ("logprobs", lambda n: packed([1.0] * n, "float32"), "logprobs"),
        ("versions", lambda n: packed([-2] * n, "int32"), "versions"),
        ("tokens", lambda n: lying("int32", MAX_TOKENS + 1, 0), "exceeds"),
        ("advantages", lambda n: lying("float32", n, 0), "carries"),
        ("group_std", lambda n: -1.0, "group_std"),
        ("group_samples", lambda n: 0, "group_samples"),
        ("group_size", lambda n: -4, "group_size"),
        ("group_mean", lambda n: NAN, "group_mean"),
        ("replayed", lambda n: 2**63, "replayed"),
        ("finish_reason", lambda n: None, "finish_reason"),
    ],
}

#: Values of every wire type for the generic mutations: a random field gets one of them.
WRONG_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    2**64 - 1,
    -(2**63),
    1.5,
    NAN,
    INF,
    -INF,
    "",
    "x" * 300,
    "ghost",
    "ünïcödé",
    b"\x00\xff",
    [],
    [1, "a"],
    [[[]]],
    {},
    {"ghost": 1},
    {"x": [None, NAN]},
    packed([1, 2, 3], "int32"),
    packed([0.5], "float32"),
    msgpack.ExtType(7, b"?"),
    lying("uint8", 9, 1),
    msgpack.Timestamp(0),
]
