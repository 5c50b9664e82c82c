"""hypothesis strategies that build valid wire records (shared by the property and fuzz tests), and
hand-made valid records: a trajectory with fields to override, and one record of every type to mutate."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from astraflow import records
from astraflow.records import DTYPES, FINISH_REASONS, encode, group_id, traj_id

names = st.from_regex(r"[A-Za-z][A-Za-z0-9_\-]{0,15}", fullmatch=True)
ids = st.text(min_size=1, max_size=40)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64, min_value=-1e12, max_value=1e12)
times = st.floats(min_value=0, max_value=4e9, allow_nan=False)
sha = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
json_leaf = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | finite | st.text(max_size=20)
json_values = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def tasks(draw: st.DrawFn) -> records.Task:
    return records.Task(
        task_id=draw(ids),
        env=draw(names),
        roles=draw(st.dictionaries(names, names, min_size=1, max_size=3)),
        group_size=draw(st.integers(1, 64)),
        prompt=draw(st.none() | st.text(max_size=100)),
        seed=draw(st.none() | st.integers(0, 2**63 - 1)),
        payload=draw(json_values),
        attempt=draw(st.integers(0, 100)),
        created_at=draw(times),
    )


@st.composite
def token_arrays(draw: st.DrawFn, n_policies: int) -> tuple[np.ndarray, ...]:
    n = draw(st.integers(0, 64))
    tokens = np.array(draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n)), np.int32)
    owner = np.array(draw(st.lists(st.integers(-1, n_policies - 1), min_size=n, max_size=n)), np.int8)
    logprobs = np.array(draw(st.lists(st.floats(-50, 0, width=32), min_size=n, max_size=n)), np.float32)
    versions = np.where(owner >= 0, draw(st.integers(0, 1000)), -1).astype(np.int32)
    return tokens, owner, logprobs, versions


@st.composite
def trajectories(draw: st.DrawFn) -> records.Trajectory:
    policies = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    tokens, owner, logprobs, versions = draw(token_arrays(len(policies)))
    group_size = draw(st.integers(1, 16))
    return records.Trajectory(
        traj_id=draw(ids),
        group_id=draw(ids),
        task_id=draw(ids),
        env=draw(names),
        policies=policies,
        tokens=tokens,
        owner=owner,
        logprobs=logprobs,
        versions=versions,
        rewards={p: draw(finite) for p in policies},
        finish_reason=draw(st.sampled_from(FINISH_REASONS)),
        error=draw(st.none() | st.text(min_size=1, max_size=50)),
        group_size=group_size,
        sample_index=draw(st.integers(0, group_size - 1)),
        attempt=draw(st.integers(0, 5)),
        worker_id=draw(ids),
        region=draw(ids),
        timings=draw(st.dictionaries(st.text(min_size=1, max_size=10), st.floats(0, 1e6), max_size=3)),
        created_at=draw(times),
    )


@st.composite
def samples(draw: st.DrawFn) -> records.Sample:
    tokens, owner, logprobs, versions = draw(token_arrays(1))
    n = len(tokens)
    adv = np.array(draw(st.lists(st.floats(-10, 10, width=32), min_size=n, max_size=n)), np.float32)
    group_size = draw(st.integers(1, 16))
    return records.Sample(
        policy=draw(names),
        traj_id=draw(ids),
        group_id=draw(ids),
        task_id=draw(ids),
        env=draw(names),
        tokens=tokens,
        loss_mask=(owner >= 0).astype(np.uint8),
        logprobs=logprobs,
        versions=versions,
        advantages=adv,
        reward=draw(finite),
        group_size=group_size,
        group_samples=draw(st.integers(1, group_size)),
        group_mean=draw(finite),
        group_std=draw(st.floats(0, 1e6)),
        finish_reason=draw(st.sampled_from(FINISH_REASONS)),
        attempt=draw(st.integers(0, 5)),
        replayed=draw(st.integers(0, 3)),
        created_at=draw(times),
    )


@st.composite
def weight_versions(draw: st.DrawFn) -> records.WeightVersion:
    version = draw(st.integers(1, 10_000))
    with_delta = draw(st.booleans())
    return records.WeightVersion(
        policy=draw(names),
        version=version,
        step=draw(st.integers(0, 10**6)),
        snapshot_version=draw(st.integers(0, version)),
        snapshot_uri=draw(ids),
        snapshot_sha256=draw(sha),
        snapshot_bytes=draw(st.integers(0, 2**40)),
        delta_uri=draw(ids) if with_delta else None,
        delta_base=draw(st.integers(0, version - 1)) if with_delta else None,
        delta_sha256=draw(sha) if with_delta else None,
        delta_bytes=draw(st.integers(0, 2**40)) if with_delta else None,
        changed_fraction=draw(st.none() | st.floats(0, 1)),
        dtype=draw(st.sampled_from(DTYPES)),
        created_at=draw(times),
    )


@st.composite
def task_stats(draw: st.DrawFn) -> records.TaskStats:
    return records.TaskStats(
        task_id=draw(ids),
        env=draw(names),
        groups=draw(st.integers(0, 10**6)),
        samples=draw(st.integers(0, 10**6)),
        mean_reward=draw(finite),
        success_rate=draw(st.floats(0, 1)),
        zero_variance_groups=draw(st.integers(0, 10**6)),
        last_version=draw(st.integers(-1, 10**6)),
        updated_at=draw(times),
    )


@st.composite
def metrics(draw: st.DrawFn) -> records.Metric:
    return records.Metric(
        component=draw(names),
        id=draw(ids),
        values=draw(st.dictionaries(st.text(min_size=1, max_size=20), finite, min_size=1, max_size=5)),
        region=draw(ids),
        step=draw(st.integers(-1, 10**6)),
        time=draw(times),
    )


@st.composite
def dead_letters(draw: st.DrawFn) -> records.DeadLetter:
    return records.DeadLetter(
        source_topic=draw(ids),
        partition=draw(st.integers(-1, 1000)),
        offset=draw(st.integers(-1, 2**62)),
        error=draw(st.text(min_size=1, max_size=100)),
        component=draw(ids),
        raw=draw(st.binary(max_size=200)),
        key=draw(st.none() | st.binary(max_size=20)),
        truncated=draw(st.booleans()),
        time=draw(times),
    )


@st.composite
def demonstrations(draw: st.DrawFn) -> records.Demonstration:
    n = draw(st.integers(0, 30))
    count = draw(st.integers(1, 5000))
    return records.Demonstration(
        policy=draw(names),
        source=draw(ids),
        index=draw(st.integers(0, count - 1)),
        count=count,
        tokens=np.asarray(draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n)), np.int32),
        loss_mask=np.asarray(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)), np.uint8),
        reward=draw(finite),
    )


@st.composite
def trajectory_batches(draw: st.DrawFn) -> records.TrajectoryBatch:
    items = draw(
        st.lists(trajectories().map(encode) | st.binary(min_size=0, max_size=50), min_size=1, max_size=4)
    )
    return records.TrajectoryBatch(group_id=draw(ids), items=items)


@st.composite
def sample_batches(draw: st.DrawFn) -> records.SampleBatch:
    items = draw(st.lists(samples().map(encode) | st.binary(min_size=0, max_size=50), min_size=1, max_size=4))
    return records.SampleBatch(group_id=draw(ids), policy=draw(names), items=items)


ALL = {
    "Task": tasks(),
    "Trajectory": trajectories(),
    "TrajectoryBatch": trajectory_batches(),
    "Sample": samples(),
    "SampleBatch": sample_batches(),
    "WeightVersion": weight_versions(),
    "TaskStats": task_stats(),
    "Metric": metrics(),
    "DeadLetter": dead_letters(),
    "Demonstration": demonstrations(),
}


def make_traj(**over: object) -> records.Trajectory:
    base: dict = dict(
        traj_id=traj_id("t1", 0, 0),
        group_id=group_id("t1", 0),
        task_id="t1",
        env="arithmetic",
        policies=["solver"],
        tokens=[5, 6, 7, 8],
        owner=[-1, -1, 0, 0],
        logprobs=[0.0, 0.0, -0.5, -1.5],
        versions=[-1, -1, 3, 4],
        rewards={"solver": 1.0},
        group_size=4,
        sample_index=0,
        created_at=1.7e9,
    )
    base.update(over)
    return records.Trajectory(**base)


def seed_records() -> list[records.Record]:
    """One valid record of every type, to mutate."""
    return [
        make_traj(),
        make_traj(
            policies=["a", "b"],
            owner=[-1, 0, 1, 1],
            versions=[-1, 2, 3, 4],
            rewards={"a": 0.5, "b": -1.0},
            error="boom",
        ),
        records.Task(
            task_id="t1", env="arithmetic", roles={"agent": "solver"}, prompt="3+4=", payload={"answer": 7}
        ),
        records.Sample(
            policy="solver",
            traj_id="t#0#1",
            group_id="t#0",
            task_id="t",
            env="e",
            tokens=[1, 2, 3],
            loss_mask=[0, 1, 1],
            logprobs=[0, -1, -2],
            versions=[-1, 2, 2],
            advantages=[0, 0.5, 0.5],
        ),
        records.WeightVersion(
            policy="solver",
            version=5,
            snapshot_version=4,
            snapshot_uri="file:///w/4",
            snapshot_sha256="a" * 64,
            delta_uri="file:///w/5.delta",
            delta_base=4,
            delta_sha256="b" * 64,
            delta_bytes=100,
            changed_fraction=0.01,
        ),
        records.TaskStats(
            task_id="t1", env="arithmetic", groups=3, samples=24, mean_reward=0.5, success_rate=0.5
        ),
        records.Metric(component="worker", id="w1", values={"tokens_per_s": 100.0}),
        records.DeadLetter(
            source_topic="trajectories",
            partition=1,
            offset=7,
            error="bad",
            component="streams",
            raw=b"\x00\x01",
            key=b"k",
        ),
    ]
