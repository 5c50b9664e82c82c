"""Builders of trajectories and groups for testing a data algorithm (a stage) without Kafka or Faust.

Part of the installed `streams` package, for plug-in authors and AstraFlow's own tests alike:
a stage is a function of one `Group` (streams/api.py), so its unit test builds a group, calls the
stage and checks what came back. Everything here is deterministic (the tokens of a trajectory
are seeded by its task, attempt and index) and every trajectory is validated.

`make_traj(task="t0", index=0, ...)` makes one `astraflow.records.Trajectory` of environment
"arith": `prompt` (3) environment tokens (owner -1, logprob 0), then `gen` (5) tokens of each
policy in `policies` (("policy",)) in turn, each with logprob -0.5 and version `version` (0; or a
dict of version per policy). `rewards` (1.0) is one reward for every policy or a dict per policy.
The other defaults: attempt 0, group_size 4, finish "stop", created_at 1000.0, error None. Its ids
are `<task>#<attempt>` (group) and `<task>#<attempt>#<index>` (trajectory), as workers write them.

`make_group(rewards, task="t0", policies=("policy",), **kw)` makes a complete `Group` of
`len(rewards)` trajectories, the i-th one `make_traj(task, i, rewards=rewards[i], ...)`:
`rewards` holds, per trajectory, one float (every policy gets it) or a dict policy -> reward; the
other keyword arguments (attempt, prompt, gen, finish, version, created_at, error) go to every
`make_traj`. For a group whose trajectories differ in more than their rewards (say, their
lengths), build the trajectories with `make_traj` and the `Group` from them.

Testing a stage (examples/astraflow-plugin-example/tests/test_length_penalty.py is the whole test):

    import pytest
    from astraflow_plugin_example import LengthPenalty
    from streams.testing import make_group

    def test_each_generated_token_costs_per_token() -> None:
        group = LengthPenalty(per_token=0.1)(make_group([1.0, 0.0], gen=5))
        assert group.rewards("policy") == pytest.approx([0.5, -0.5])  # the 3 prompt tokens are free
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from astraflow.records import Trajectory, group_id, traj_id
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
    traj = Trajectory(
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
    )
    traj.validate()  # checks and normalises in place
    return traj


def make_group(
    rewards: Sequence[float | dict[str, float]],
    *,
    task: str = "t0",
    policies: tuple[str, ...] = ("policy",),
    **kw: Any,
) -> Group:
    """A complete group of `len(rewards)` trajectories of `task`, the i-th with `rewards[i]`; the
    keyword arguments go to every `make_traj`."""
    trajs = [
        make_traj(task, i, group_size=len(rewards), policies=policies, rewards=r, **kw)
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
