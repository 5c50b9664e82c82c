"""Builders of test trajectories and groups (no Kafka)."""

from __future__ import annotations

import zlib

import numpy as np

from astraflow.records import Trajectory, encode, group_id, traj_id
from streams.api import Group


def make_traj(
    task: str = "t0",
    index: int = 0,
    *,
    attempt: int = 0,
    group_size: int = 4,
    policies: tuple[str, ...] = ("policy",),
    rewards: dict[str, float] | float = 1.0,
    prompt: int = 3,
    gen: int = 5,
    finish: str = "stop",
    version: int | dict[str, int] = 0,
    created_at: float = 1_000.0,
    error: str | None = None,
) -> Trajectory:
    """A trajectory: `prompt` environment tokens, then `gen` tokens of each policy in turn."""
    if not isinstance(rewards, dict):
        rewards = {p: float(rewards) for p in policies}
    owner = [-1] * prompt
    versions = [-1] * prompt
    for i, p in enumerate(policies):
        v = version[p] if isinstance(version, dict) else version
        owner += [i] * gen
        versions += [v] * gen
    n = len(owner)
    rng = np.random.default_rng(zlib.crc32(f"{task}#{attempt}#{index}".encode()))
    return Trajectory(
        traj_id=traj_id(task, attempt, index),
        group_id=group_id(task, attempt),
        task_id=task,
        env="arith",
        policies=list(policies),
        tokens=rng.integers(0, 50, n).astype(np.int32),
        owner=np.array(owner, np.int8),
        logprobs=np.where(np.array(owner) >= 0, -0.5, 0.0).astype(np.float32),
        versions=np.array(versions, np.int32),
        rewards=rewards,
        finish_reason=finish,
        error=error,
        group_size=group_size,
        sample_index=index,
        attempt=attempt,
        created_at=created_at,
    ).validate()


def make_group(
    rewards: list[float] | list[dict[str, float]],
    *,
    task: str = "t0",
    policies: tuple[str, ...] = ("policy",),
    **kw: object,
) -> Group:
    trajs = [
        make_traj(task, i, group_size=len(rewards), policies=policies, rewards=r, **kw)  # type: ignore[arg-type]
        for i, r in enumerate(rewards)
    ]
    return Group(
        group_id=trajs[0].group_id,
        task_id=task,
        env="arith",
        policies=list(policies),
        group_size=len(rewards),
        trajectories=trajs,
    )


def raw(traj: Trajectory) -> bytes:
    return encode(traj)
