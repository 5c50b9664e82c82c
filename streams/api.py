"""What a data algorithm sees: the `Group` it transforms and the `StageContext` it may read.

This module is the whole contract for algorithm authors, built-in or plug-in (see README.md,
"Writing a data algorithm"). An algorithm knows nothing of Kafka or Faust:

    class MyFilter:
        def __init__(self, *, threshold: float = 0.5) -> None: ...   # recipe `args` -> kwargs
        def setup(self, ctx: StageContext) -> None: ...              # optional
        def __call__(self, group: Group) -> Group | list[Group] | None: ...

It receives one group of trajectories of one task attempt (complete, or partial after the group
timeout) and returns it (possibly with trajectories removed through `Group.remove`), a list of
groups (reuse stages add replayed copies), or None to drop the whole group (reason: the stage's
name, or what `Group.drop` said). Drops are counted by reason; nothing disappears silently.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from astraflow.records import Trajectory

#: `kind` values a stage of `streams.pipeline` may declare (default "transform"). The pipeline
#: builder (streams/pipeline.py) wants exactly one "advantage", every "filter" before it and every
#: "reuse" after it; an "observe" stage must return the group it was given, nothing removed.
KINDS = ("filter", "advantage", "observe", "reuse", "transform")


@dataclass
class Group:
    """The trajectories of one task attempt, with what the stages computed about them so far."""

    group_id: str
    task_id: str
    env: str
    policies: list[str]
    """Every policy listed by a trajectory of the group, in order of first appearance."""
    group_size: int
    trajectories: list[Trajectory]
    complete: bool = True
    """False when the group was emitted by the group timeout with fewer than `group_size`."""
    replayed: int = 0
    """0 for fresh data; k for the k-th reuse of a group by `replay` or `mix`."""
    advantages: dict[str, np.ndarray] = field(default_factory=dict)
    """Per policy: one sequence advantage per trajectory (0 for trajectories without its tokens)."""
    stats: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per policy: (mean, std) of the rewards the advantage was computed from."""
    skip_policies: set[str] = field(default_factory=set)
    """Policies that get no Sample from this group (e.g. zero variance for that policy only)."""
    drops: Counter[str] = field(default_factory=Counter)
    """Trajectories removed so far, by reason."""
    dropped: str | None = None
    """Set when the whole group was dropped: the reason."""

    # ------------------------------------------------------------------ views

    def __len__(self) -> int:
        return len(self.trajectories)

    def members(self, policy: str) -> np.ndarray:
        """Indices of the trajectories that hold at least one token of `policy`."""
        return np.array(
            [i for i, t in enumerate(self.trajectories) if bool(owner_mask(t, policy).any())], dtype=np.int64
        )

    def rewards(self, policy: str) -> np.ndarray:
        """float64 rewards of `policy`, one per trajectory (NaN for a trajectory that does not list
        the policy: use them through `members(policy)`)."""
        return np.array([t.rewards.get(policy, np.nan) for t in self.trajectories], dtype=np.float64)

    def min_version(self, policy: str | None = None) -> int:
        """Oldest weight version among the generated tokens of the group (-1 if none)."""
        versions = [t.min_version(policy) for t in self.trajectories]
        versions = [v for v in versions if v >= 0]
        return min(versions) if versions else -1

    # ------------------------------------------------------------------ edits

    def remove(self, drop: np.ndarray | list[bool], reason: str) -> None:
        """Remove the trajectories where `drop` is true, counting them under `reason`."""
        mask = np.asarray(drop, dtype=bool)
        if mask.shape != (len(self.trajectories),):
            raise ValueError(f"drop mask has shape {mask.shape}, the group has {len(self.trajectories)}")
        n = int(mask.sum())
        if not n:
            return
        keep = ~mask
        self.trajectories = [t for t, k in zip(self.trajectories, keep, strict=True) if k]
        self.advantages = {p: a[keep] for p, a in self.advantages.items()}
        self.drops[reason] += n

    def drop(self, reason: str) -> None:
        """Drop the whole group (its remaining trajectories count under `reason`)."""
        if self.trajectories:
            self.drops[reason] += len(self.trajectories)
        self.trajectories = []
        self.advantages = {}
        self.dropped = reason

    def replay_copy(self, k: int) -> Group:
        """The k-th reuse of this group: same data and advantages, ids suffixed `~r<k>`, so the
        trainer (which drops duplicate group_ids) treats it as a new group."""
        trajs = [
            dataclasses.replace(t, traj_id=f"{t.traj_id}~r{k}", group_id=f"{t.group_id}~r{k}")
            for t in self.trajectories
        ]
        return dataclasses.replace(
            self,
            group_id=f"{self.group_id}~r{k}",
            trajectories=trajs,
            replayed=k,
            advantages={p: a.copy() for p, a in self.advantages.items()},
            stats=dict(self.stats),
            skip_policies=set(self.skip_policies),
            drops=Counter(),
            dropped=None,
        )


def owner_mask(traj: Trajectory, policy: str) -> np.ndarray:
    """Tokens of `traj` generated by `policy`. Trajectories of one group may list different policies
    (the referential game's speaker and listener views), so the index is per trajectory."""
    if policy not in traj.policies:
        return np.zeros(len(traj.tokens), dtype=bool)
    return traj.owner == traj.policies.index(policy)


class VersionTracker:
    """Newest weight version seen in the stream, per policy: the streams stage's view of "now"
    for staleness (the trainer, which knows its real version, applies the hard bound)."""

    def __init__(self) -> None:
        self.newest: dict[str, int] = {}

    def observe(self, traj: Trajectory) -> None:
        for i, policy in enumerate(traj.policies):
            mask = traj.owner == i
            if mask.any():
                v = int(traj.versions[mask].max())
                if v > self.newest.get(policy, -1):
                    self.newest[policy] = v

    def lag(self, traj: Trajectory) -> int:
        """Largest version lag among the policies of `traj` (0 if it generated nothing)."""
        worst = 0
        for policy in traj.policies:
            oldest = traj.min_version(policy)
            if oldest >= 0:
                worst = max(worst, self.newest.get(policy, oldest) - oldest)
        return worst


@dataclass
class StageContext:
    """Run-wide facts a stage may read in `setup`."""

    policies: list[str]
    max_staleness: int
    seed: int = 0
    versions: VersionTracker = field(default_factory=VersionTracker)


class Stage:
    """Optional base class for algorithms: a `kind` and a no-op `setup`."""

    kind: ClassVar[str] = "transform"

    def setup(self, ctx: StageContext) -> None:  # noqa: B027 - optional hook
        pass
