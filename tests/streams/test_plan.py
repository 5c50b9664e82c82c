"""Golden tests of `plan_emission`, the decisions of an emission (streams/plan.py): routing, the
intent, dead-lettering a failed group, the task-stats `dropped` rule, the counters. Plain values in,
an Emission out: no Kafka, no Faust, no event loop."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from astraflow.config.streams import GroupConfig
from astraflow.kafka import partition_for
from astraflow.records import Trajectory, encode
from streams.advantages import GRPO
from streams.api import Group, Stage, StageContext
from streams.filters import ZeroVariance
from streams.grouping import INTENT, PENDING, Action, OpenGroup
from streams.pipeline import Pipeline
from streams.plan import Emission, Letter, Routes, pack, plan_emission
from streams.reuse import Replay
from streams.stats import TaskStatsStage, dropped_summary
from streams.testing import make_traj
from streams.validate import Validate

ROUTES = Routes(
    trajectories="ns.trajectories",
    samples={"a": "ns.samples.a", "b": "ns.samples.b"},
    partitions={"a": 4, "b": 7},
)


class Boom(Stage):
    def __call__(self, group: Group) -> Group:
        raise RuntimeError("boom")


#: the states of an open group (streams.grouping.OpenGroup)
Open = Literal["pending", "intent"]


def pipeline(*stages: tuple[str, Any]) -> Pipeline:
    ctx = StageContext(policies=["a", "b"], max_staleness=2)
    for _, stage in stages:
        if hasattr(stage, "setup"):
            stage.setup(ctx)
    return Pipeline(validate=Validate(), group=GroupConfig(), stages=list(stages), ctx=ctx)


def trajs(task: str, rewards: list[dict[str, float]]) -> list[Trajectory]:
    return [
        make_traj(task, i, policies=tuple(r), rewards=r, group_size=len(rewards), created_at=100.0 + i)
        for i, r in enumerate(rewards)
    ]


def meta(ts: list[Trajectory], state: Open = PENDING, **extra: Any) -> OpenGroup:
    return OpenGroup(
        p=5,
        state=state,
        first=0.0,
        size=ts[0].group_size,
        ids=[t.traj_id for t in ts],
        offs=[40 + i for i in range(len(ts))],
        task=ts[0].task_id,
        env=ts[0].env,
        policies=list(ts[0].policies),
        **extra,
    )


def group(ts: list[Trajectory], complete: bool = True) -> Group:
    first = ts[0]
    return Group(
        first.group_id, first.task_id, first.env, list(first.policies), first.group_size, ts, complete
    )


def plan(ts: list[Trajectory], p: Pipeline, action: Action = "complete", state: Open = PENDING) -> Emission:
    m = meta(ts, state, **({"at": 50.0, "targets": [["ns.samples.a", 3]]} if state == INTENT else {}))
    bodies: list[tuple[str, bytes | None]] = [(t.traj_id, encode(t)) for t in ts]
    g = None if action == "timeout_drop" else group(ts, complete=action == "complete")
    return plan_emission(ts[0].group_id, m, action, g, pipeline=p, routes=ROUTES, bodies=bodies)


TWO = [{"a": 0.0, "b": 0.0}, {"a": 1.0, "b": 2.0}, {"a": 0.0, "b": 4.0}]


def test_the_partition_is_kafkas_murmur2_of_the_key() -> None:
    # Kafka's own vectors (UtilsTest.testMurmur2): "21" -> -973932308, "foobar" -> -790332482;
    # the partition is (hash & 0x7fffffff) % n: 1173551340 % 3 = 0, % 7 = 3; 1357151166 % 4 = 2
    assert [partition_for("21", 3), partition_for("21", 7), partition_for("foobar", 4)] == [0, 3, 2]


def test_a_complete_group_goes_to_every_policys_topic_keyed_and_partitioned_by_its_group_id() -> None:
    e = plan(trajs("t0", TWO), pipeline(("task_stats", TaskStatsStage()), ("grpo", GRPO())))
    a, b = partition_for("t0#0", 4), partition_for("t0#0", 7)
    assert e.outcome == "emit" and e.emitted and not e.recovers
    assert [(r.policy, r.topic, r.partition, r.key, r.sample.traj_id) for r in e.samples] == [
        *[("a", "ns.samples.a", a, b"t0#0", f"t0#0#{i}") for i in range(3)],
        *[("b", "ns.samples.b", b, b"t0#0", f"t0#0#{i}") for i in range(3)],
    ]
    assert [r.sample.advantages.max() for r in e.samples[:3]] == pytest.approx(
        [0.0, 2 / 3**0.5, 0.0], abs=1e-5
    )
    assert e.intent == sorted([("ns.samples.a", a), ("ns.samples.b", b)])  # written before any Sample
    assert e.letters == []
    assert [(s["gid"], s["n"], s["dropped"]) for s in e.summaries] == [("t0#0", 3, False)]
    assert e.counts == {"groups.complete": 1, "stage.group.out": 3}
    assert e.newest == 102.0  # created_at of the newest trajectory: the end-to-end latency


def test_a_group_timed_out_and_emitted_is_counted_so() -> None:
    e = plan(trajs("t0", TWO[:2]), pipeline(("grpo", GRPO())), action="timeout_emit")
    assert e.counts == {"groups.timeout_emitted": 1, "stage.group.out": 2} and e.emitted


def test_a_group_whose_intent_a_dead_worker_wrote_writes_none_and_is_read_back() -> None:
    e = plan(trajs("t0", TWO), pipeline(("grpo", GRPO())), state=INTENT)
    assert e.intent is None and e.recovers and len(e.samples) == 6
    assert e.meta["targets"] == [["ns.samples.a", 3]]  # what the emitter reads back, with the new targets


def test_a_group_a_stage_fails_on_is_dead_lettered_whole_and_reaches_no_trainer() -> None:
    ts = trajs("t0", TWO)
    e = plan(ts, pipeline(("task_stats", TaskStatsStage()), ("boom", Boom()), ("grpo", GRPO())))
    why = "stage 'boom' failed on group t0#0: RuntimeError: boom"
    assert e.outcome == "fail" and not e.emitted
    assert (e.samples, e.intent) == ([], None)
    assert e.letters == [
        Letter("ns.trajectories", 5, 40 + i, b"t0#0", encode(t), f"Trajectory t0#0#{i}: {why}")
        for i, t in enumerate(ts)
    ]
    assert [(s["gid"], s["n"], s["dropped"]) for s in e.summaries] == [("t0#0", 3, True)]
    assert e.counts == {"groups.complete": 1, "stage.group.out": 3}


@pytest.mark.parametrize("with_stats", [True, False])
def test_a_group_dropped_at_its_timeout_sends_only_its_dropped_summary(with_stats: bool) -> None:
    stages = [("task_stats", TaskStatsStage())] if with_stats else []
    e = plan(trajs("t0", TWO[:1]), pipeline(*stages, ("grpo", GRPO())), action="timeout_drop")
    assert e.outcome == "drop" and (e.samples, e.intent, e.letters) == ([], None, [])
    assert e.summaries == ([dropped_summary("t0#0", "t0", "arith")] if with_stats else [])
    assert e.counts == {
        "groups.timeout_dropped": 1,
        "stage.group.dropped.timeout": 1,
        "trajectories.dropped.timeout": 1,
    }


def test_a_group_filtered_whole_makes_no_sample_and_no_intent_and_is_dropped_in_the_stats() -> None:
    flat = [{"a": 1.0, "b": 1.0}] * 3
    e = plan(
        trajs("t0", flat),
        pipeline(("task_stats", TaskStatsStage()), ("zv", ZeroVariance()), ("grpo", GRPO())),
    )
    assert e.outcome == "emit" and not e.emitted and (e.samples, e.intent) == ([], None)
    assert [(s["gid"], s["zero_variance"], s["dropped"]) for s in e.summaries] == [("t0#0", True, True)]


def test_a_group_that_misses_one_of_its_policies_counts_as_dropped() -> None:
    # policy b's rewards are all equal: per_policy skips b, so the group reaches a's trainer only
    rewards = [{"a": float(i), "b": 1.0} for i in range(3)]
    stages = [("task_stats", TaskStatsStage()), ("zv", ZeroVariance(per_policy=True)), ("grpo", GRPO())]
    e = plan(trajs("t0", rewards), pipeline(*stages))
    assert {r.policy for r in e.samples} == {"a"} and e.intent == [("ns.samples.a", partition_for("t0#0", 4))]
    assert [s["dropped"] for s in e.summaries] == [True]


def test_a_replayed_copy_is_routed_by_its_own_group_id_and_leaves_the_stats_alone() -> None:
    p = pipeline(("task_stats", TaskStatsStage()), ("grpo", GRPO()), ("replay", Replay(times=1, delay=1)))
    first = plan(trajs("t0", TWO), p)
    second = plan(trajs("t1", TWO), p)  # one fresh group later: t0's copy comes with it
    assert {r.key for r in first.samples} == {b"t0#0"}
    copies = [r for r in second.samples if r.key == b"t0#0~r1"]
    assert [(r.policy, r.partition) for r in copies] == [("a", partition_for("t0#0~r1", 4))] * 3 + [
        ("b", partition_for("t0#0~r1", 7))
    ] * 3
    assert second.intent == sorted({(r.topic, r.partition) for r in second.samples})
    assert [(s["gid"], s["dropped"]) for s in second.summaries] == [("t1#0", False)]


def test_samples_are_packed_one_record_per_group_and_policy_and_halved_for_the_failpoint() -> None:
    e = plan(trajs("t0", TWO), pipeline(("grpo", GRPO())))
    policies = frozenset({"a", "b"})
    assert [
        (o.policy, o.topic, o.partition, o.key, len(o.batch.items)) for o in pack(e.samples, policies)
    ] == [
        ("a", "ns.samples.a", partition_for("t0#0", 4), b"t0#0", 3),
        ("b", "ns.samples.b", partition_for("t0#0", 7), b"t0#0", 3),
    ]
    halves = pack(e.samples, policies, halves=True)  # Samples 0-2 (a), then 3-5 (b)
    assert [(o.policy, len(o.batch.items)) for o in halves] == [("a", 3), ("b", 3)]
    # a0 a1 | a2 b0: the failpoint's halves cut through policy a
    assert [(o.policy, len(o.batch.items)) for o in pack(e.samples[:4], policies, halves=True)] == [
        ("a", 2),
        ("a", 1),
        ("b", 1),
    ]


def test_each_record_goes_to_the_partition_of_its_own_group_id() -> None:
    p = pipeline(("grpo", GRPO()), ("replay", Replay(times=1, delay=1)))
    plan(trajs("t0", TWO), p)
    second = plan(trajs("t1", TWO), p)  # t1's Samples and t0's copy, in one emission
    records = pack(second.samples, frozenset({"a", "b"}))
    assert sorted((o.key, o.policy, o.partition) for o in records) == sorted(
        (gid.encode(), policy, partition_for(gid, ROUTES.partitions[policy]))
        for gid in ("t1#0", "t0#0~r1")
        for policy in ("a", "b")
    )
