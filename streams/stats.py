"""`task_stats`: per-task statistics for selective rollout and curricula (the feeder reads them).

Two halves, because the groups of one task (attempts 0, 1, ...) have different group_ids and so
arrive on different `trajectories` partitions, while the statistics must be aggregated in one place:

1. the `task_stats` stage (inside the main pipeline) turns each group into a small summary
   (`summarize`), which the app sends to an internal topic keyed by task_id (a repartition);
2. an aggregator agent on that topic folds summaries into a table keyed by task_id (`fold`) and
   publishes the running TaskStats to the compacted `task-stats` topic.

`fold` remembers the last group_ids it applied per task, so a summary delivered twice (a restart
re-sends it) is not counted twice. Place `task_stats` before the filters to see every group,
including the zero-variance ones the feeder wants to know about.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from astraflow.records import TaskStats
from streams.api import Group, Stage
from streams.filters import constant

RECENT_GROUPS = 64


def summarize(group: Group, success_threshold: float = 1.0) -> dict[str, Any]:
    """One group's contribution: trajectories, reward sum, successes, zero variance, newest version.

    A trajectory's reward here is the mean of the rewards of the policies it lists."""
    rewards = np.array([np.mean([t.rewards[p] for p in t.policies]) for t in group.trajectories],
                       dtype=np.float64)
    zero_var = all(constant(group.rewards(p)[group.members(p)]) for p in group.policies)
    versions = [int(t.versions.max()) for t in group.trajectories if t.versions.size]
    return {
        "gid": group.group_id, "task": group.task_id, "env": group.env, "n": len(group),
        "reward_sum": float(rewards.sum()), "successes": int((rewards >= success_threshold).sum()),
        "zero_variance": bool(zero_var and len(group) > 0), "version": max(versions, default=-1),
        "dropped": False,
    }


def dropped_summary(group_id: str, task_id: str, env: str) -> dict[str, Any]:
    """The contribution of a group dropped before any of its trajectories could be summarized
    (a group timeout): no samples, but one group that reaches no trainer."""
    return {"gid": group_id, "task": task_id, "env": env, "n": 0, "reward_sum": 0.0, "successes": 0,
            "zero_variance": False, "version": -1, "dropped": True}


def fold(state: dict[str, Any] | None, summary: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Add a summary to a task's running state. Returns (new state, applied); a group already
    applied (by group_id, among the last RECENT_GROUPS) leaves the state unchanged."""
    state = state or {"groups": 0, "samples": 0, "reward_sum": 0.0, "successes": 0, "zero_variance": 0,
                      "dropped": 0, "version": -1, "recent": [], "env": summary["env"]}
    if summary["gid"] in state["recent"]:
        return state, False
    new = {
        "groups": state["groups"] + 1,
        "samples": state["samples"] + summary["n"],
        "reward_sum": state["reward_sum"] + summary["reward_sum"],
        "successes": state["successes"] + summary["successes"],
        "zero_variance": state["zero_variance"] + int(summary["zero_variance"]),
        "dropped": state.get("dropped", 0) + int(summary.get("dropped", False)),
        "version": max(state["version"], summary["version"]),
        "recent": [*state["recent"], summary["gid"]][-RECENT_GROUPS:],
        "env": summary["env"],
    }
    return new, True


def to_record(task_id: str, state: dict[str, Any], now: float | None = None) -> TaskStats:
    n = state["samples"]
    return TaskStats(
        task_id=task_id, env=state["env"], groups=state["groups"], samples=n,
        mean_reward=state["reward_sum"] / n if n else 0.0,
        success_rate=min(1.0, state["successes"] / n) if n else 0.0,
        zero_variance_groups=state["zero_variance"], dropped_groups=state.get("dropped", 0), last_version=max(-1, state["version"]),
        updated_at=time.time() if now is None else now,
    )


class TaskStatsStage(Stage):
    """Observes each group (changes nothing); the app forwards `summarize(group)` to the
    aggregator. Replayed groups are not counted."""

    kind = "observe"

    def __init__(self, *, success_threshold: float = 1.0) -> None:
        self.success_threshold = float(success_threshold)
        self.summaries: list[dict[str, Any]] = []

    def __call__(self, group: Group) -> Group:
        if group.replayed == 0 and len(group):
            self.summaries.append(summarize(group, self.success_threshold))
        return group

    def take(self) -> list[dict[str, Any]]:
        out, self.summaries = self.summaries, []
        return out
