"""The group state machine over plain tables: dedupe, completion, timeouts, intent/done, TTL."""

from __future__ import annotations

from typing import Any

from astraflow.config.streams import GroupConfig
from astraflow.records import encode
from streams.grouping import DONE, INTENT, PENDING, DictTable, GroupCollector, is_run, pack_run
from streams.testing import make_traj


def collector(**kw: Any) -> GroupCollector:
    return GroupCollector(GroupConfig(**kw), DictTable(), DictTable())


def test_collects_until_complete_and_drops_duplicate_traj_ids() -> None:
    c = collector()
    t = [make_traj("t0", i, group_size=3) for i in range(3)]
    assert c.add(t[0], encode(t[0]), partition=5, now=10.0, offset=100).outcome == "added"
    dup = c.add(t[0], encode(t[0]), partition=5, now=11.0, offset=101)
    assert (dup.outcome, dup.ready) == ("duplicate", False)
    assert not c.add(t[1], encode(t[1]), 5, 12.0, 102).ready
    last = c.add(t[2], encode(t[2]), 5, 13.0, 103)
    assert (last.outcome, last.ready) == ("added", True)
    meta = c.groups.get("t0#0")
    assert meta["ids"] == ["t0#0#0", "t0#0#1", "t0#0#2"] and meta["offs"] == [100, 102, 103]
    assert meta["first"] == 10.0 and meta["state"] == PENDING
    assert c.bodies_of("t0#0")[1] == ("t0#0#1", encode(t[1]))
    # every write names the partition the group came from
    assert {p for _, _, p in c.groups.writes + c.bodies.writes} == {5}
    assert c.due(now=14.0) == [("t0#0", "complete")]


def test_a_duplicate_of_a_complete_group_reports_ready() -> None:
    # after a restart the last trajectory is re-delivered: the group is complete but not emitted
    c = collector()
    t = [make_traj("t0", i, group_size=2) for i in range(2)]
    for x in t:
        c.add(x, encode(x), 0, 1.0)
    assert c.add(t[1], encode(t[1]), 0, 2.0).ready


def test_intent_then_done_keeps_a_tombstone_and_drops_late_trajectories() -> None:
    c = collector(dedupe_ttl_s=100.0)
    t = [make_traj("t0", i, group_size=2) for i in range(2)]
    for x in t:
        c.add(x, encode(x), 3, 1.0)
    meta = c.mark_intent("t0#0", at=2.0, targets=[("ns.samples.policy", 1)])
    assert meta["state"] == INTENT and meta["targets"] == [["ns.samples.policy", 1]]
    assert c.due(now=2.5) == [("t0#0", "complete")]  # an intent is still owed
    assert c.mark_done("t0#0", now=3.0) == ["t0#0#0", "t0#0#1"]  # the bodies, deleted once it is acked
    assert c.groups.get("t0#0") == {"p": 3, "state": DONE, "at": 3.0}
    assert c.delete_bodies("t0#0", ["t0#0#0", "t0#0#1"], 3) == 2 and c.bodies.data == {}
    assert c.add(t[0], encode(t[0]), 3, 4.0).outcome == "late"
    assert c.due(now=50.0) == []
    assert c.due(now=103.0) == [("t0#0", "expire")]
    c.forget("t0#0")
    assert c.groups.data == {} and c.groups.writes[-1] == ("t0#0", None, 3)


def test_timeouts_emit_partial_groups_or_drop_small_ones() -> None:
    c = collector(timeout_s=30.0, on_timeout="emit", min_size=2)
    a = [make_traj("a", i, group_size=4) for i in range(2)]
    b = [make_traj("b", 0, group_size=4)]
    for x in a + b:
        c.add(x, encode(x), 0, 100.0)
    assert c.due(now=129.0) == []
    assert sorted(c.due(now=130.0)) == [("a#0", "timeout_emit"), ("b#0", "timeout_drop")]
    d = collector(timeout_s=30.0, on_timeout="drop")
    d.add(a[0], encode(a[0]), 0, 100.0)
    assert d.due(now=200.0) == [("a#0", "timeout_drop")]


def test_due_only_looks_at_assigned_partitions() -> None:
    c = collector(timeout_s=1.0)
    x, y = make_traj("a", 0, group_size=2), make_traj("b", 0, group_size=2)
    c.add(x, encode(x), 0, 0.0)
    c.add(y, encode(y), 1, 0.0)
    assert c.due(now=5.0, partitions={1}) == [("b#0", "timeout_emit")]
    assert c.pending() == 2


def test_inconsistent_members_are_refused() -> None:
    c = collector()
    x = make_traj("t0", 0, group_size=3)
    c.add(x, encode(x), 0, 0.0)
    other_size = make_traj("t0", 1, group_size=4)
    res = c.add(other_size, encode(other_size), 0, 0.0)
    assert res.outcome == "inconsistent" and "group_size 4 differs from 3" in res.reason
    other_task = make_traj("t1", 1, group_size=3)
    other_task.group_id = "t0#0"  # claims the group of another task
    res = c.add(other_task, encode(other_task.validate()), 0, 0.0)
    assert res.outcome == "inconsistent" and "task_id 't1'" in res.reason
    assert c.groups.get("t0#0")["ids"] == ["t0#0#0"]
    # Members may list other policies (one view per policy, as in the referential game): not refused.
    view = make_traj("t0", 1, group_size=3, policies=("a", "b"))
    assert c.add(view, encode(view), 0, 0.0).outcome == "added"
    assert c.groups.get("t0#0")["policies"] == ["policy", "a", "b"]


def test_a_record_of_several_trajectories_costs_two_writes_and_its_bodies_read_back_in_order() -> None:
    c = collector()
    t = [make_traj("t0", i, group_size=4) for i in range(4)]
    added = c.add_record([(x, encode(x)) for x in (t[0], t[1], t[1])], 2, 1.0, offset=7)
    assert [a.outcome for a in added] == ["added", "added", "duplicate"]  # a repeat inside the record too
    assert len(c.groups.writes) == 1 and len(c.bodies.writes) == 1
    assert c.bodies.get("t0#0#0") == pack_run([encode(t[0]), encode(t[1])]) and c.bodies.get("t0#0#1") is None
    assert not is_run(encode(t[0]))  # one trajectory's bytes stay as they were
    last = c.add_record([(x, encode(x)) for x in (t[2], t[3])], 2, 2.0, offset=9)
    assert all(a.ready for a in last)
    assert c.bodies_of("t0#0") == [(x.traj_id, encode(x)) for x in t]
    assert c.groups.get("t0#0")["offs"] == [7, 7, 9, 9]
    keys = c.mark_done("t0#0", 3.0)
    assert not [v for _, v, _ in c.bodies.writes if v is None]  # no delete before the tombstone's ack
    c.delete_bodies("t0#0", keys, 2)
    deletes = [(k, p) for k, v, p in c.bodies.writes if v is None]
    assert deletes == [("t0#0#0", 2), ("t0#0#2", 2)] and c.bodies.data == {}  # one delete per entry


def test_a_re_delivered_record_repairs_the_bodies_a_crash_lost() -> None:
    c = collector()
    t = [make_traj("t0", i, group_size=3) for i in range(3)]
    c.add_record([(x, encode(x)) for x in t[:2]], 0, 1.0)
    del c.bodies.data["t0#0#0"]  # the meta's changelog write survived the crash, the body's did not
    assert c.bodies_of("t0#0") == [("t0#0#0", None), ("t0#0#1", None)]
    again = c.add_record([(x, encode(x)) for x in t[:2]], 0, 2.0)
    assert [a.outcome for a in again] == ["duplicate", "duplicate"]
    assert c.bodies_of("t0#0") == [(x.traj_id, encode(x)) for x in t[:2]]
    assert c.add_record([(t[2], encode(t[2]))], 0, 3.0)[0].ready


def test_a_record_of_trajectories_of_two_groups_is_refused() -> None:
    import pytest

    c = collector()
    with pytest.raises(ValueError, match="one group"):
        c.add_record([(make_traj("a", 0), b""), (make_traj("b", 0), b"")], 0, 1.0)


def test_the_bodies_of_a_group_open_again_are_not_deleted() -> None:
    c = collector(dedupe_ttl_s=0.0)
    t = make_traj("t0", 0, group_size=2)
    c.add(t, encode(t), 1, 1.0)
    keys = c.mark_done("t0#0", 2.0)
    c.forget("t0#0")  # expired before the tombstone's ack (a TTL of 0), then sent anew
    c.add(t, encode(t), 1, 3.0)
    assert c.delete_bodies("t0#0", keys, 1) == 0 and c.bodies_of("t0#0") == [(t.traj_id, encode(t))]


def test_orphans_are_the_bodies_of_done_groups_only() -> None:
    """What a restart finds after crashes: the tombstone of `done` durable, its bodies' deletes lost;
    `meta_lost`'s body durable, its meta's write lost with a record not yet committed; `open`'s
    second record's body durable and its meta's update lost. Only `done`'s bodies are orphans:
    the re-deliveries of the others write their entries again."""
    c = collector()
    done = [make_traj("done", i, group_size=3) for i in range(3)]
    c.add_record([(x, encode(x)) for x in done[:2]], 4, 1.0)
    c.add(done[2], encode(done[2]), 4, 1.0)
    c.mark_done("done#0", 2.0)  # its bodies not deleted: the crash lost the deletes
    unacked = make_traj("unacked", 0, group_size=1)
    c.add(unacked, encode(unacked), 4, 1.0)
    c.mark_done("unacked#0", 2.0)  # the tombstone not acknowledged yet: its bodies stay
    lost = make_traj("meta_lost", 0, group_size=2)
    c.bodies.set(lost.traj_id, encode(lost), 0)
    opened = [make_traj("open", i, group_size=3) for i in range(2)]
    c.add(opened[0], encode(opened[0]), 0, 1.0)
    c.bodies.set(opened[1].traj_id, encode(opened[1]), 0)
    other = make_traj("other", 0, group_size=1)
    c.add(other, encode(other), 7, 1.0)
    c.mark_done("other#0", 2.0)
    before = set(c.bodies.data)
    assert c.delete_orphans({4}, unacked={"unacked#0"}) == 2  # partition 7 is not ours
    assert before - set(c.bodies.data) == {"done#0#0", "done#0#2"}
    assert [(k, p) for k, v, p in c.bodies.writes if v is None] == [("done#0#0", 4), ("done#0#2", 4)]
    assert c.delete_orphans(unacked={"unacked#0"}) == 1 and "other#0#0" not in c.bodies.data
    assert c.delete_orphans() == 1 and set(c.bodies.data) == {"meta_lost#0#0", "open#0#0", "open#0#1"}


def test_a_held_record_that_brings_its_group_complete_writes_nothing_until_the_intent() -> None:
    c = collector()
    t = [make_traj("t0", i, group_size=3) for i in range(3)]
    added = c.add_record([(x, encode(x)) for x in t], 4, 1.0, offset=9, hold=True)
    assert [(a.outcome, a.ready) for a in added] == [("added", True)] * 3
    assert c.held == {"t0#0"} and c.groups.writes == [] and c.bodies.writes == []
    assert [body for _, body in c.bodies_of("t0#0")] == [encode(x) for x in t]  # in memory
    assert c.due(now=2.0) == [("t0#0", "complete")]
    # a copy of the record while it is held: a duplicate, held too (its offset waits as well)
    again = c.add_record([(x, encode(x)) for x in t], 4, 1.5, offset=10, hold=True)
    assert [a.outcome for a in again] == ["duplicate"] * 3 and c.held == {"t0#0"} and c.bodies.writes == []
    c.mark_intent("t0#0", at=2.0, targets=[])
    assert [(k, v["state"], p) for k, v, p in c.groups.writes] == [("t0#0", INTENT, 4)]
    assert c.groups.writes[0][1]["ids"] == [x.traj_id for x in t]  # the intent carries the whole meta
    assert c.mark_done("t0#0", now=3.0) == []  # no bodies to delete from the changelog
    assert c.held == set() and c.bodies.data == {} and c.bodies.writes == []
    assert c.add_record([(t[0], encode(t[0]))], 4, 4.0, hold=True)[0].outcome == "late"


def test_only_a_record_that_alone_completes_a_new_group_is_held() -> None:
    c = collector()
    t = [make_traj("t0", i, group_size=3) for i in range(3)]
    part = c.add_record([(x, encode(x)) for x in t[:2]], 0, 1.0, hold=True)
    assert c.held == set() and len(c.groups.writes) == len(c.bodies.writes) == 1
    assert [a.outcome for a in part] == ["added"] * 2
    rest = c.add_record([(t[2], encode(t[2]))], 0, 2.0, hold=True)  # completes an open group
    assert rest[0].ready and c.held == set()
    odd = [make_traj("t1", i, group_size=3) for i in range(3)]
    odd[2] = make_traj("t1", 2, group_size=4)  # inconsistent with its group: not all added
    c.add_record([(x, encode(x)) for x in odd], 0, 3.0, hold=True)
    assert c.held == set()


def test_persist_writes_a_held_group_to_the_tables() -> None:
    c = collector()
    t = [make_traj("t0", i, group_size=2) for i in range(2)]
    c.add_record([(x, encode(x)) for x in t], 1, 1.0, offset=3, hold=True)
    assert c.persist("t0#0") and not c.persist("t0#0")  # once; then it is an ordinary open group
    assert [(k, p) for k, _, p in c.groups.writes] == [("t0#0", 1)]
    assert [(k, p) for k, _, p in c.bodies.writes] == [("t0#0#0", 1)]  # the one entry holding both
    assert c.mark_done("t0#0", now=2.0) == ["t0#0#0"]  # deleted from the changelog once acknowledged
