"""`task_stats`: per-task statistics for selective rollout and curricula (the feeder reads them).

Two halves, because the groups of one task (attempts 0, 1, ...) have different group_ids, while the
statistics must be aggregated in one place, the `task_stats` table's partition that the task_id
hashes to:

1. the `task_stats` stage (inside the main pipeline) turns each group into a small summary
   (`summarize`);
2. `StatsTable` folds summaries into that table (`fold`) and publishes the running TaskStats to the
   compacted `task-stats` topic. A group that arrived on that same partition of `trajectories`
   (workers send every group of a task there, workers/batching.py) is folded as it is emitted
   (streams/sink.py, `KafkaSink.send_summary`); any other summary goes through an internal topic
   keyed by task_id (a repartition) to an agent that folds it on the partition's owner.

`fold` remembers the last group_ids it applied per task, so a summary delivered twice (a restart
re-sends it) is not counted twice. `parse_summary` checks every record of the internal topic before
`fold` sees it (anyone who can write to the topic can write anything): a malformed one is a
RecordError naming the field, which the app dead-letters instead of crash-looping on it. Place
`task_stats` before the filters to see every group, including the zero-variance ones the feeder
wants to know about.

`TaskSummary` (the internal topic's records) and `TaskState` (the table's values) are TypedDicts:
both are stored msgpack-encoded as exactly these dicts, in this key order, so a restarted worker
reads what an older one wrote.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Awaitable
from typing import Any, NotRequired, TypedDict, cast

import msgpack
import numpy as np

from astraflow.errors import RecordError
from astraflow.records import TaskStats, encode
from streams.api import Group, Stage
from streams.filters import constant
from streams.metrics import Counters

RECENT_GROUPS = 64
#: TaskStats produced by one `StatsTable.publish` at most: after a restart every task of the table is
#: published again, which must not hold the event loop for seconds
PUBLISH_AT_ONCE = 1024
MAX_SUMMARY_BYTES = 64 << 10
MAX_ID_CHARS = 4096


class TaskSummary(TypedDict):
    """One group's contribution to its task's statistics (a record of the internal topic)."""

    gid: str  # the group (fold skips a group it has already applied)
    task: str
    env: str
    n: int  # trajectories (0 for a group dropped before it could be summarized)
    reward_sum: float
    successes: int  # trajectories whose reward reached the success threshold
    zero_variance: bool
    version: int  # newest policy version among its tokens (-1: none)
    dropped: bool  # the group reaches no trainer


class TaskState(TypedDict):
    """A task's running statistics, the value of the `task_stats` table."""

    groups: int
    samples: int
    reward_sum: float
    successes: int
    zero_variance: int  # groups
    dropped: NotRequired[int]  # groups; absent in states written before it was counted
    version: int
    recent: list[str]  # the last RECENT_GROUPS group_ids applied (dedupe)
    env: str
    at: NotRequired[float]  # set by the runtime: when it was last updated (eviction order)
    p: NotRequired[int]  # set by the runtime: the changelog partition it was written to


# field -> (accepted types, check); bool is kept apart from int (True is an int in Python)
_SUMMARY: dict[str, tuple[tuple[type, ...], Any]] = {
    "gid": ((str,), lambda v: 0 < len(v) <= MAX_ID_CHARS),
    "task": ((str,), lambda v: 0 < len(v) <= MAX_ID_CHARS),
    "env": ((str,), lambda v: 0 < len(v) <= MAX_ID_CHARS),
    "n": ((int,), lambda v: 0 <= v < 2**31),
    "reward_sum": ((float, int), math.isfinite),
    "successes": ((int,), lambda v: 0 <= v < 2**31),
    "zero_variance": ((bool,), None),
    "version": ((int,), lambda v: -1 <= v < 2**63),
    "dropped": ((bool,), None),
}


def parse_summary(raw: bytes | None, key: bytes | None = None) -> TaskSummary:
    """Decode and check one record of the internal task-update topic (what `summarize` or
    `dropped_summary` made, msgpack-encoded, keyed by task_id). Raises RecordError naming the field."""
    if raw is None:
        raise RecordError("<bytes>", "empty record (null value)", "TaskUpdate")
    if len(raw) > MAX_SUMMARY_BYTES:
        raise RecordError("<bytes>", f"{len(raw)} bytes exceed {MAX_SUMMARY_BYTES}", "TaskUpdate")
    try:
        summary = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise RecordError("<bytes>", f"not msgpack: {type(exc).__name__}: {exc}", "TaskUpdate") from None
    if not isinstance(summary, dict):
        raise RecordError("<bytes>", f"a {type(summary).__name__}, not a map", "TaskUpdate")
    unknown = sorted(str(k) for k in summary if k not in _SUMMARY)
    if unknown:
        raise RecordError(unknown[0], "unknown field", "TaskUpdate")
    for name, (types, check) in _SUMMARY.items():
        if name not in summary:
            raise RecordError(name, "missing", "TaskUpdate")
        value = summary[name]
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            raise RecordError(
                name,
                f"{type(value).__name__} {value!r:.80}, expected {' or '.join(t.__name__ for t in types)}",
                "TaskUpdate",
            )
        if check is not None and not check(value):
            raise RecordError(name, f"{value!r:.80} out of range", "TaskUpdate")
    if summary["successes"] > summary["n"]:
        raise RecordError("successes", f"{summary['successes']} exceed n {summary['n']}", "TaskUpdate")
    if key is not None and key != summary["task"].encode():
        raise RecordError(
            "<key>", f"Kafka key {key[:80]!r} is not the task {summary['task']!r:.80}", "TaskUpdate"
        )
    return cast(TaskSummary, summary)  # every field checked above


def summarize(group: Group, success_threshold: float = 1.0) -> TaskSummary:
    """One group's contribution: trajectories, reward sum, successes, zero variance, newest version.

    A trajectory's reward here is the mean of the rewards of the policies it lists."""
    rewards = np.array(
        [np.mean([t.rewards[p] for p in t.policies]) for t in group.trajectories], dtype=np.float64
    )
    zero_var = all(constant(group.rewards(p)[group.members(p)]) for p in group.policies)
    versions = [int(t.versions.max()) for t in group.trajectories if t.versions.size]
    return TaskSummary(
        gid=group.group_id,
        task=group.task_id,
        env=group.env,
        n=len(group),
        reward_sum=float(rewards.sum()),
        successes=int((rewards >= success_threshold).sum()),
        zero_variance=bool(zero_var and len(group) > 0),
        version=max(versions, default=-1),
        dropped=False,
    )


def dropped_summary(group_id: str, task_id: str, env: str) -> TaskSummary:
    """The contribution of a group dropped before any of its trajectories could be summarized
    (a group timeout): no samples, but one group that reaches no trainer."""
    return TaskSummary(
        gid=group_id,
        task=task_id,
        env=env,
        n=0,
        reward_sum=0.0,
        successes=0,
        zero_variance=False,
        version=-1,
        dropped=True,
    )


def fold(state: TaskState | None, summary: TaskSummary) -> tuple[TaskState, bool]:
    """Add a summary to a task's running state. Returns (new state, applied); a group already
    applied (by group_id, among the last RECENT_GROUPS) leaves the state unchanged."""
    state = state or TaskState(
        groups=0,
        samples=0,
        reward_sum=0.0,
        successes=0,
        zero_variance=0,
        dropped=0,
        version=-1,
        recent=[],
        env=summary["env"],
    )
    if summary["gid"] in state["recent"]:
        return state, False
    new = TaskState(
        groups=state["groups"] + 1,
        samples=state["samples"] + summary["n"],
        reward_sum=state["reward_sum"] + summary["reward_sum"],
        successes=state["successes"] + summary["successes"],
        zero_variance=state["zero_variance"] + int(summary["zero_variance"]),
        dropped=state.get("dropped", 0) + int(summary.get("dropped", False)),
        version=max(state["version"], summary["version"]),
        recent=[*state["recent"], summary["gid"]][-RECENT_GROUPS:],
        env=summary["env"],
    )
    return new, True


def to_record(task_id: str, state: TaskState, now: float | None = None) -> TaskStats:
    n = state["samples"]
    return TaskStats(
        task_id=task_id,
        env=state["env"],
        groups=state["groups"],
        samples=n,
        mean_reward=state["reward_sum"] / n if n else 0.0,
        success_rate=min(1.0, state["successes"] / n) if n else 0.0,
        zero_variance_groups=state["zero_variance"],
        dropped_groups=state.get("dropped", 0),
        last_version=max(-1, state["version"]),
        updated_at=time.time() if now is None else now,
    )


class StatsTable:
    """The `task_stats` table and what it publishes. `apply` folds one summary into its task's
    running state and writes it to the table's changelog `partition` (the task's partition of the
    internal topic, whose owner this worker is); `publish` then produces the newest TaskStats of
    every task updated since it last ran. Past `max_tasks` the least recently updated tenth of the
    tasks is deleted.

    The table is the durable state (its writes are acknowledged before a group is done, or before
    the summary's offset is committed); TaskStats are its publication, produced after the group's
    Samples so that they cost the group's emission no time. A crash can lose a publication, never
    a count: after a start or a rebalance every task of the partitions it brought is published
    again (`republish`), and a summary delivered twice publishes its task's state again."""

    def __init__(self, table: Any, topic: Any, counters: Counters, max_tasks: int) -> None:
        self.table, self.topic, self.counters, self.max_tasks = table, topic, counters, max_tasks
        self.dirty: dict[str, None] = {}  # the tasks to publish, in the order they were updated

    def apply(self, summary: TaskSummary, partition: int) -> list[Awaitable[Any]]:
        """Fold `summary` in; the deliveries of the table's writes (none when its group was applied
        before: a summary delivered twice, or a group emitted again after a crash)."""
        task = summary["task"]
        state, applied = fold(self.table.get(task), summary)
        self.dirty[task] = None
        if not applied:
            self.counters.inc("task_stats.duplicates")
            return []
        state = {**state, "at": time.time(), "p": partition}  # for the eviction below
        self.table.set(task, state, partition)
        self._evict()
        return self.table.written()

    def republish(self, partitions: set[int]) -> None:
        """Publish every task of the table's `partitions` again at the next `publish`."""
        for task, state in self.table.items():
            if state is not None and state.get("p", 0) in partitions:
                self.dirty[task] = None

    async def publish(self, most: int = PUBLISH_AT_ONCE) -> int:
        """Produce the newest TaskStats of the tasks updated since they were last published (the
        `most` least recently updated; the rest at the next call). Returns how many were produced;
        the flush before the next offset commit makes them durable."""
        tasks = list(itertools.islice(self.dirty, most))
        for task in tasks:
            del self.dirty[task]
        sent = 0
        for task in tasks:
            state = self.table.get(task)
            if state is None:  # evicted meanwhile
                continue
            await self.topic.send(key=task.encode(), value=encode(to_record(task, state)))
            sent += 1
        if sent:
            self.counters.inc("task_stats.published", sent)
        return sent

    def _evict(self) -> None:
        """Past `max_tasks` tasks, delete the least recently updated tenth (one scan per tenth of
        the limit, so the cost per update stays small)."""
        size = self.table.size()
        if size <= self.max_tasks:
            return
        keep = self.max_tasks - self.max_tasks // 10
        oldest = sorted(self.table.items(), key=lambda kv: (kv[1] or {}).get("at", 0.0))[: size - keep]
        for task, state in oldest:
            self.table.delete(task, (state or {}).get("p", 0))
            self.dirty.pop(task, None)
        self.counters.inc("task_stats.evicted", len(oldest))


class TaskStatsStage(Stage):
    """Observes each group (changes nothing); the app forwards `summarize(group)` to the
    aggregator. Replayed groups are not counted."""

    kind = "observe"

    def __init__(self, *, success_threshold: float = 1.0) -> None:
        self.success_threshold = float(success_threshold)
        self.summaries: list[TaskSummary] = []

    def __call__(self, group: Group) -> Group:
        if group.replayed == 0 and len(group):
            self.summaries.append(summarize(group, self.success_threshold))
        return group

    def take(self) -> list[TaskSummary]:
        out, self.summaries = self.summaries, []
        return out
