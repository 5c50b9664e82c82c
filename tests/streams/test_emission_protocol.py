"""The crash protocol of streams/emit.py, in process: the emitter writes through a fake sink that
kills it as its k-th step starts, a restarted emitter goes on from the tables and topics that
survived, and for every k (and every split of the unacknowledged records between lost and kept)
no Sample is lost and none is duplicated, every failed trajectory is dead-lettered (at least once)
and every group counts once in its task's statistics. A few milliseconds a run;
tests/streams/test_crash_broker.py does the same with SIGKILLs of real workers on the real broker."""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from typing import Any

import pytest

from astraflow.config.streams import GroupConfig
from astraflow.records import Trajectory, encode
from streams.advantages import GRPO
from streams.api import Group, Stage, StageContext
from streams.emission import Emitter
from streams.emit import partition_for
from streams.filters import ZeroVariance
from streams.grouping import DONE, INTENT, GroupCollector
from streams.pipeline import Pipeline
from streams.plan import Routes
from streams.stats import TaskState, TaskStatsStage, fold
from streams.testing import make_traj
from streams.validate import Validate
from tests.streams.fake_sink import (
    DEADLETTER,
    KEEP,
    TASK_UPDATES,
    Broker,
    Crash,
    FakeSink,
    FakeTable,
    Write,
)

ROUTES = Routes(
    trajectories="ns.trajectories",
    samples={"a": "ns.samples.a", "b": "ns.samples.b"},
    partitions={"a": 3, "b": 2},
)
STAGE = GroupConfig(timeout_s=60.0, on_timeout="drop")
NOW = 1_000.0  # every group is past its timeout: the incomplete one is dropped


class Boom(Stage):
    """A plug-in that fails on the groups of task `fails`."""

    def __call__(self, group: Group) -> Group:
        if group.task_id == "fails":
            raise RuntimeError("boom")
        return group


def pipeline() -> Pipeline:
    stages = [("task_stats", TaskStatsStage()), ("boom", Boom()), ("zero_variance", ZeroVariance())]
    return Pipeline(
        validate=Validate(),
        group=STAGE,
        stages=[*stages, ("grpo", GRPO())],
        ctx=StageContext(policies=["a", "b"], max_staleness=2),
    )


def trajectories() -> list[Trajectory]:
    """Five groups of four: one of two policies, one a stage fails on, one with a single trajectory
    (dropped at its timeout), one of equal rewards (filtered), one of policy `a`."""

    def group(task: str, n: int = 4, **kw: Any) -> list[Trajectory]:
        return [make_traj(task, i, group_size=4, **kw) for i in range(n)]

    return [
        *[
            make_traj("two", i, policies=("a", "b"), rewards={"a": float(i % 2), "b": float(i)})
            for i in range(4)
        ],
        *group("fails", policies=("a",)),
        *group("late", 1, policies=("a",)),
        *group("flat", policies=("a",), rewards=1.0),
        *[make_traj("one", i, policies=("a",), rewards=float(i)) for i in range(4)],
    ]


EXPECTED = {
    "ns.samples.a": [f"{task}#0#{i}" for task in ("two", "one") for i in range(4)],
    "ns.samples.b": [f"two#0#{i}" for i in range(4)],
}
FAILURE = "stage 'boom' failed on group fails#0: RuntimeError: boom"
#: task -> (groups, samples, dropped) once every summary is folded
STATS = {"two": (1, 4, 0), "fails": (1, 4, 1), "late": (1, 0, 1), "flat": (1, 4, 1), "one": (1, 4, 0)}


def consumed(tasks: frozenset[str] | None = None) -> Broker:
    """The state before the emission: every group (of `tasks`) in the tables, durable. A group's
    trajectories came in one record (a worker's TrajectoryBatch)."""
    return Broker(list(_consumed(tasks)))


@functools.cache
def _consumed(tasks: frozenset[str] | None) -> tuple[Write, ...]:
    broker = Broker()
    sink = FakeSink(broker)
    collector = GroupCollector(STAGE, FakeTable("groups", sink, {}), FakeTable("bodies", sink, {}))
    records: dict[str, list[tuple[Trajectory, bytes]]] = {}
    for traj in trajectories():
        if tasks is None or traj.task_id in tasks:
            records.setdefault(traj.group_id, []).append((traj, encode(traj)))
    for offset, items in enumerate(records.values()):
        collector.add_record(items, partition=offset % 2, now=0.0, offset=offset)
    sink.durable(lambda w: True)
    return tuple(broker.log)


def life(broker: Broker, crash_at: int | None = None, keep: str = "none") -> FakeSink:
    """A worker that starts from what `broker` holds and emits every due group, or dies trying."""
    sink = FakeSink(broker, crash_at, KEEP[keep])
    groups = FakeTable("groups", sink, broker.table("groups"))
    collector = GroupCollector(STAGE, groups, FakeTable("bodies", sink, broker.table("bodies")))
    emitter = Emitter(collector, pipeline(), ROUTES, sink, cache={}, arrived={})
    try:
        asyncio.run(emitter.emit(collector.due(NOW)))
    except Crash:
        assert sink.crashed, "a Crash the sink did not raise"
        return sink
    sink.durable(lambda w: True)  # the producer flush before the next offset commit
    return sink


def problems(broker: Broker) -> list[str]:
    """What is wrong with the state after the groups were emitted."""
    out = []
    for topic, want in EXPECTED.items():
        got = Counter(s.traj_id for s in broker.samples(topic))
        if got != Counter(want):
            lost, extra = set(want) - set(got), {k: n for k, n in got.items() if n > 1 or k not in want}
            out.append(f"{topic}: lost {sorted(lost)}, duplicated or foreign {extra}")
    # dead letters are at least once: a crash before the group is marked done sends them again
    reasons = {w.value.reason for w in broker.records(DEADLETTER)}
    if reasons != {f"Trajectory fails#0#{i}: {FAILURE}" for i in range(4)}:
        out.append(f"dead letters: {sorted(reasons)}")
    states: dict[str, TaskState] = {}
    for w in broker.records(TASK_UPDATES):  # the aggregator folds each group once
        states[w.value["task"]] = fold(states.get(w.value["task"]), w.value)[0]
    stats = {task: (s["groups"], s["samples"], s.get("dropped", 0)) for task, s in states.items()}
    if stats != STATS:
        out.append(f"task stats: {stats}")
    undone = [gid for gid, meta in broker.table("groups").items() if meta["state"] != DONE]
    if undone or broker.table("bodies"):
        out.append(f"not done: {undone}; bodies left: {sorted(broker.table('bodies'))}")
    return out


def test_without_a_crash_every_group_is_finished_once() -> None:
    broker = consumed()
    life(broker)
    assert problems(broker) == []


def test_the_order_of_one_groups_writes_and_waits_is_the_protocol() -> None:
    broker = consumed(frozenset({"one"}))
    part = partition_for("one#0", 3)
    assert life(broker).steps == [
        "write changelog.groups[0] 'one#0'",  # the intent
        "send now",
        "ack changelog.groups[0] 'one#0'",  # durable before any Sample exists
        f"write ns.samples.a[{part}] b'one#0'",  # the group's four Samples, one record
        "write task-updates[0] b'one'",
        "send now",
        f"ack ns.samples.a[{part}] b'one#0'",
        "ack task-updates[0] b'one'",  # every record acknowledged before the group is done
        "write changelog.bodies[0] 'one#0#0'",  # its bodies deleted (one entry held all four)
        "write changelog.groups[0] 'one#0'",  # done; durable by the flush before the next commit
    ]


def steps_of_a_clean_life(base: Broker) -> int:
    return len(life(Broker(list(base.log))).steps)


@pytest.mark.parametrize("keep", sorted(KEEP))
def test_a_crash_at_any_step_then_a_restart_loses_and_duplicates_nothing(keep: str) -> None:
    n = steps_of_a_clean_life(consumed())
    assert n > 30  # the sweep covers every group's writes and waits
    for k in range(1, n + 1):
        broker = consumed()
        died = life(broker, crash_at=k, keep=keep)
        assert died.crashed
        life(broker)
        assert problems(broker) == [], f"crash at step {k} ({died.steps[-1]}), in flight kept: {keep}"


def test_a_second_crash_while_recovering_loses_and_duplicates_nothing() -> None:
    """The first worker dies with intents written; the next dies while reading them back or
    producing what was missing; the third finishes."""
    n = steps_of_a_clean_life(consumed())
    interrupted = 0
    for k in range(1, n + 1):
        first = consumed()
        life(first, crash_at=k, keep="records")
        if not any(m["state"] == INTENT for m in first.table("groups").values()):
            continue
        interrupted += 1
        for j in range(1, steps_of_a_clean_life(first) + 1, 2):
            broker = Broker(list(first.log))
            life(broker, crash_at=j, keep="records")
            life(broker)
            assert problems(broker) == [], f"crashes at steps {k}, then {j}"
    assert interrupted > 5
