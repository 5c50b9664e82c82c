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
from astraflow.kafka import partition_for
from astraflow.records import Trajectory, encode
from streams.advantages import GRPO
from streams.api import Group, Stage, StageContext
from streams.emission import Emitter
from streams.filters import ZeroVariance
from streams.grouping import DONE, INTENT, DictTable, GroupCollector
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


def restarted(broker: Broker, sink: FakeSink) -> tuple[GroupCollector, Emitter]:
    """A worker's group state and emitter, its tables rebuilt from what `broker` holds."""
    collector = GroupCollector(
        STAGE,
        FakeTable("groups", sink, broker.table("groups")),
        FakeTable("bodies", sink, broker.table("bodies")),
    )
    return collector, Emitter(collector, pipeline(), ROUTES, sink, cache={}, arrived={})


def survives(sink: FakeSink, run: Any) -> bool:
    """Run the worker's coroutine function `run`; False if the sink killed it."""
    try:
        asyncio.run(run())
    except Crash:
        assert sink.crashed, "a Crash the sink did not raise"
        return False
    return True


def life(broker: Broker, crash_at: int | None = None, keep: str = "none") -> FakeSink:
    """A worker that starts from what `broker` holds, or dies trying: as the runtime's first sweep,
    it deletes the bodies a crash left to groups already done; it emits every due group; as its
    next sweep, it deletes the bodies of the groups whose tombstones are acknowledged."""
    sink = FakeSink(broker, crash_at, KEEP[keep])
    collector, emitter = restarted(broker, sink)

    async def run() -> None:
        await emitter.delete_orphans()
        await emitter.emit(collector.due(NOW))
        await emitter.delete_done_bodies()

    if not survives(sink, run):
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


def stranded(broker: Broker) -> list[str]:
    """The open groups that lack a trajectory's body. Every record was committed before the
    emission (`consumed`), so no re-delivery would ever bring it back: such a group never ends."""
    collector = GroupCollector(STAGE, DictTable(), DictTable())
    collector.groups.data, collector.bodies.data = broker.table("groups"), broker.table("bodies")
    return [
        gid
        for gid, meta in collector.metas()
        if meta["state"] != DONE and any(body is None for _, body in collector.bodies_of(gid))
    ]


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
        "write changelog.groups[0] 'one#0'",  # done; durable by the flush before the next commit
        "ack changelog.groups[0] 'one#0'",  # the next sweep waits for the tombstone,
        "write changelog.bodies[0] 'one#0#0'",  # then deletes the bodies (one entry held all four)
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
        where = f"crash at step {k} ({died.steps[-1]}), in flight kept: {keep}"
        assert stranded(broker) == [], where
        life(broker)
        assert problems(broker) == [], where


@pytest.mark.parametrize("keep", ["records", "bodies"])
def test_a_second_crash_while_recovering_loses_and_duplicates_nothing(keep: str) -> None:
    """The first worker dies with intents written; the next dies while reading them back, producing
    what was missing or deleting bodies; the third finishes."""
    n = steps_of_a_clean_life(consumed())
    interrupted = 0
    for k in range(1, n + 1):
        first = consumed()
        life(first, crash_at=k, keep=keep)
        if not any(m["state"] == INTENT for m in first.table("groups").values()):
            continue
        interrupted += 1
        for j in range(1, steps_of_a_clean_life(first) + 1, 2):
            broker = Broker(list(first.log))
            life(broker, crash_at=j, keep=keep)
            assert stranded(broker) == [], f"crashes at steps {k}, then {j}"
            life(broker)
            assert problems(broker) == [], f"crashes at steps {k}, then {j}"
    assert interrupted > 5


def test_a_body_lost_with_an_uncommitted_record_waits_for_its_re_delivery() -> None:
    """The group's meta was durable, its body not, and the record was never committed: the restarted
    worker neither emits the group nor deletes anything of it; the re-delivered record repairs the
    body, and the group is emitted once."""
    broker = consumed(frozenset({"one"}))
    broker.log = [w for w in broker.log if w.topic != "changelog.bodies"]
    assert stranded(broker) == ["one#0"]
    life(broker)
    assert stranded(broker) == ["one#0"] and not broker.samples("ns.samples.a")  # waits
    sink = FakeSink(broker)
    collector = GroupCollector(
        STAGE, FakeTable("groups", sink, broker.table("groups")), FakeTable("bodies", sink, {})
    )
    collector.add_record([(t, encode(t)) for t in trajectories() if t.task_id == "one"], partition=0, now=0.0)
    sink.durable(lambda w: True)
    life(broker)
    assert Counter(s.traj_id for s in broker.samples("ns.samples.a")) == Counter(
        f"one#0#{i}" for i in range(4)
    )
    assert (
        not stranded(broker)
        and broker.table("groups")["one#0"]["state"] == DONE
        and not broker.table("bodies")
    )


def test_groups_queued_while_a_batch_is_emitted_form_the_next_batch() -> None:
    """The emitter's loop: the groups queued before it runs go in one batch (one intent wait and one
    Sample wait for all of them), counted `emit.batches`; a group queued later makes a batch of its own."""
    broker = consumed()
    sink = FakeSink(broker)
    collector = GroupCollector(
        STAGE,
        FakeTable("groups", sink, broker.table("groups")),
        FakeTable("bodies", sink, broker.table("bodies")),
    )
    emitter = Emitter(collector, pipeline(), ROUTES, sink, cache={}, arrived={})
    due = collector.due(NOW)
    assert len(due) > 2

    async def settle() -> None:
        for _ in range(1000):
            await asyncio.sleep(0)
            if not emitter.queue and not emitter.emitting:
                return
        raise AssertionError("the emitter did not finish its batches")

    async def run() -> tuple[float, float]:
        loop = asyncio.create_task(emitter.run())
        for gid, action in due[:-1]:
            emitter.enqueue(gid, action)
        await settle()
        first = emitter.counters.values["emit.batches"]
        emitter.enqueue(*due[-1])
        await settle()
        loop.cancel()
        await emitter.delete_done_bodies()  # the next sweep's
        return first, emitter.counters.values["emit.batches"]

    assert asyncio.run(run()) == (1, 2)
    sink.durable(lambda w: True)
    assert problems(broker) == []


# ---------------------------------------------------------------- groups held in memory
#
# A record that brings its group complete is added with `hold=True` (as the runtime does): the
# group's state stays in memory, and the record is acknowledged only once the group is done. Its
# offset is committed only then, by a commit whose flush makes the done tombstone durable first;
# until that commit the record is delivered again after a crash.


def records() -> dict[int, list[tuple[Trajectory, bytes]]]:
    """offset -> one record: every group's trajectories (all but `late`'s are complete)."""
    groups: dict[str, list[tuple[Trajectory, bytes]]] = {}
    for traj in trajectories():
        groups.setdefault(traj.group_id, []).append((traj, encode(traj)))
    return dict(enumerate(groups.values()))


def held_life(
    broker: Broker,
    committed: set[int],
    crash_at: int | None = None,
    keep: str = "none",
    commit_at_crash: bool = False,
    tasks: frozenset[str] | None = None,
) -> FakeSink:
    """A worker that consumes every record not in `committed` as the runtime does, holding the
    records of groups they bring complete, emits every due group, and commits what it acknowledged
    (after a flush); or dies at step `crash_at`, just after such a commit if `commit_at_crash`."""
    sink = FakeSink(broker, crash_at, KEEP[keep])
    collector, emitter = restarted(broker, sink)
    acked: set[int] = set()

    def commit() -> None:
        sink.durable(lambda w: True)
        committed.update(acked)

    if commit_at_crash:
        sink.before_crash = commit

    def acknowledge(offset: int) -> Any:
        async def ack() -> None:
            sink.step(f"record {offset} acknowledged", awaits=False)
            acked.add(offset)

        return ack

    async def run() -> None:
        await emitter.delete_orphans()
        for offset, items in records().items():
            if offset in committed or (tasks is not None and items[0][0].task_id not in tasks):
                continue
            collector.add_record(items, partition=offset % 2, now=0.0, offset=offset, hold=True)
            sink.written()
            if items[0][0].group_id in collector.held:
                emitter.hold(items[0][0].group_id, acknowledge(offset))
            else:
                await acknowledge(offset)()
        await emitter.emit(collector.due(NOW))
        await emitter.delete_done_bodies()

    if survives(sink, run):
        commit()
    return sink


def test_a_held_group_writes_nothing_before_its_intent_and_its_record_waits_for_its_tombstone() -> None:
    broker, committed = Broker(), set[int]()
    part = partition_for("one#0", 3)
    assert held_life(broker, committed, tasks=frozenset({"one"})).steps == [
        "write changelog.groups[0] 'one#0'",  # the intent: the group's first changelog write
        "send now",
        "ack changelog.groups[0] 'one#0'",
        f"write ns.samples.a[{part}] b'one#0'",
        "write task-updates[0] b'one'",
        "send now",
        f"ack ns.samples.a[{part}] b'one#0'",
        "ack task-updates[0] b'one'",
        "write changelog.groups[0] 'one#0'",  # done
        "record 4 acknowledged",  # its offset may be committed now: the commit's flush covers the tombstone
    ]
    assert committed == {4} and broker.table("groups")["one#0"]["state"] == DONE
    assert not broker.records("changelog.bodies")  # its bodies never left the process


def test_held_groups_without_a_crash_are_finished_once_and_every_record_is_committed() -> None:
    broker, committed = Broker(), set[int]()
    held_life(broker, committed)
    assert problems(broker) == [] and committed == set(records())
    # only the incomplete group (`late`, one record of one trajectory) wrote a body
    assert {w.key for w in broker.records("changelog.bodies")} == {"late#0#0"}


@pytest.mark.parametrize("commit_at_crash", [False, True], ids=["no-commit", "commit-then-crash"])
@pytest.mark.parametrize("keep", sorted(KEEP))
def test_a_crash_at_any_step_of_held_groups_then_a_restart_loses_and_duplicates_nothing(
    keep: str, commit_at_crash: bool
) -> None:
    n = len(held_life(Broker(), set()).steps)
    assert n > 25
    for k in range(1, n + 1):
        broker, committed = Broker(), set[int]()
        died = held_life(broker, committed, crash_at=k, keep=keep, commit_at_crash=commit_at_crash)
        assert died.crashed
        where = f"crash at step {k} ({died.steps[-1]}), in flight kept: {keep}, commit: {commit_at_crash}"
        held_life(broker, committed)  # the records not committed come again
        assert problems(broker) == [], where
        assert committed == set(records()), where
