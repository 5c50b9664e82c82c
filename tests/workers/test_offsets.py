"""Out-of-order task completion: only offsets below every in-flight task may be committed."""

from __future__ import annotations

from workers.offsets import OffsetTracker


def test_commit_position_waits_for_the_oldest_task() -> None:
    t = OffsetTracker()
    for off in (10, 11, 12):
        t.start(0, off)
    assert t.position(0) == 10
    assert t.finish(0, 12) is None  # 10 and 11 still running
    assert t.finish(0, 11) is None
    assert t.finish(0, 10) == 13  # all done: next to consume is 13
    assert t.inflight() == 0


def test_partitions_are_independent_and_gaps_allowed() -> None:
    t = OffsetTracker()
    t.start(0, 5)
    t.start(1, 7)
    t.start(0, 9)  # offsets 6-8 were skipped (e.g. compacted or dead-lettered elsewhere)
    assert t.finish(0, 5) == 9
    assert t.finish(1, 7) == 8
    assert t.finish(0, 9) == 10
    assert t.finish(0, 9) is None  # unknown or already finished


def test_forget_returns_inflight_offsets() -> None:
    t = OffsetTracker()
    t.start(3, 1)
    t.start(3, 2)
    t.finish(3, 2)
    assert t.forget(3) == [1]
    assert t.position(3) is None
    assert t.finish(3, 1) is None
