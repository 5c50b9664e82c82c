"""Grouping, dedupe, staleness and restart offsets of the trainer's sample buffer."""

from __future__ import annotations

import numpy as np
import pytest

from astraflow.records import Sample, group_id, traj_id
from trainer.batching import BadSample, GroupBuffer, lag_of


def sample(
    task: str, index: int, n: int = 2, versions: tuple[int, ...] = (0, 0), policy: str = "p", length: int = 4
) -> Sample:
    tokens = np.arange(length, dtype=np.int32)
    mask = np.zeros(length, np.uint8)
    mask[-len(versions) :] = 1
    vers = np.full(length, -1, np.int32)
    vers[-len(versions) :] = versions
    return Sample(
        policy=policy,
        traj_id=traj_id(task, 0, index),
        group_id=group_id(task, 0),
        task_id=task,
        env="arith",
        tokens=tokens,
        loss_mask=mask,
        logprobs=np.zeros(length, np.float32),
        versions=vers,
        advantages=np.zeros(length, np.float32),
        group_size=n,
        group_samples=n,
    )


def test_groups_complete_on_distinct_traj_ids_and_queue_in_order() -> None:
    buf = GroupBuffer("p")
    assert buf.add(sample("a", 0), 0, 0) == "pending"
    assert buf.add(sample("b", 0), 1, 0) == "pending"
    assert buf.add(sample("a", 0), 0, 1) == "duplicate"  # same traj_id again
    assert buf.add(sample("b", 1), 1, 1) == "complete"
    assert buf.add(sample("a", 1), 0, 2) == "complete"
    assert list(buf.ready) == ["b#0", "a#0"]
    assert buf.take(1, None, version=0, max_staleness=0).group_ids == ["b#0"]
    assert buf.take(2, None, version=0, max_staleness=0) is None  # one queued, two wanted


def test_token_budget_closes_batches() -> None:
    buf = GroupBuffer("p")
    for task, length in (("a", 10), ("b", 10), ("c", 10)):
        for i in range(2):
            buf.add(sample(task, i, length=length), 0, len(buf.pending) * 2 + i)
    assert buf.take(8, 45, 0, 0).group_ids == ["a#0", "b#0"]  # 20 + 20; c would make 60
    assert buf.take(8, 45, 0, 0) is None  # c alone (20 tokens) is under budget: wait for more
    assert buf.take(8, 20, 0, 0).group_ids == ["c#0"]  # exactly the budget closes
    buf.add(sample("d", 0, length=100), 0, 10)
    buf.add(sample("d", 1, length=100), 0, 11)
    assert buf.take(8, 45, 0, 0).group_ids == ["d#0"]  # an oversized group still trains alone


def test_trained_groups_are_dropped_as_duplicates_and_survive_a_restart() -> None:
    buf = GroupBuffer("p", dedupe_window=2)
    for i, task in enumerate("abc"):
        buf.add(sample(task, 0, n=1), 0, i)
        buf.done(buf.take(1, None, 0, 0), step=i + 1)
    assert list(buf.trained) == ["b#0", "c#0"]  # the window forgets the oldest
    again = GroupBuffer("p", dedupe_window=2)
    again.restore(buf.state())
    assert again.add(sample("c", 0, n=1), 0, 9) == "duplicate"
    assert again.add(sample("a", 0, n=1), 0, 10) == "complete"  # forgotten: trains again
    assert again.counts["samples.duplicate"] == 1 and again.counts["groups.trained"] == 3


def test_stale_samples_are_dropped_and_counted() -> None:
    buf = GroupBuffer("p")
    buf.add(sample("a", 0, versions=(3, 4)), 0, 0)
    buf.add(sample("a", 1, versions=(5, 5)), 0, 1)
    batch = buf.take(1, None, version=6, max_staleness=2)
    assert [s.traj_id for s in batch.samples] == ["a#0#1"] and batch.lags == [1]
    assert [s.traj_id for s in batch.stale] == ["a#0#0"] and buf.counts["samples.stale"] == 1
    assert lag_of(sample("x", 0, versions=(7,)), 6) == 0  # ahead of the trainer: no lag


def test_samples_of_lost_versions_are_stale_and_the_loss_survives_a_restart() -> None:
    buf = GroupBuffer("p")
    buf.lose_versions(4, 6)  # versions 5 and 6 were published by a run that crashed before checkpointing
    again = GroupBuffer("p")
    again.restore(buf.state())
    for b in (buf, again):
        for i, versions in enumerate([(4, 4), (4, 5), (6, 6), (7, 7)]):
            b.add(sample("a", i, n=4, versions=versions), 0, i)
        batch = b.take(1, None, version=7, max_staleness=100)
        assert [s.traj_id for s in batch.samples] == ["a#0#0", "a#0#3"]
        assert [s.traj_id for s in batch.stale] == ["a#0#1", "a#0#2"] and b.counts["samples.stale"] == 2


def test_restart_offsets_point_at_the_oldest_untrained_sample() -> None:
    buf = GroupBuffer("p")
    buf.add(sample("a", 0), 0, 0)  # a stays incomplete
    buf.add(sample("b", 0), 0, 1)
    buf.add(sample("b", 1), 0, 2)  # b complete
    buf.add(sample("c", 0), 1, 5)
    buf.add(sample("c", 1), 1, 6)  # c complete
    buf.consumed(1, 7)  # a record that was dead-lettered
    assert buf.offsets() == {0: 0, 1: 5}
    buf.done(buf.take(2, None, 0, 0), step=1)
    assert buf.offsets() == {0: 0, 1: 8}  # a still waits at offset 0; partition 1 is all done
    buf.add(sample("a", 1), 0, 3)
    buf.done(buf.take(1, None, 0, 0), step=2)
    assert buf.offsets() == {0: 4, 1: 8}


def test_unusable_samples_are_errors() -> None:
    buf = GroupBuffer("p")
    with pytest.raises(BadSample, match="policy 'q'"):
        buf.add(sample("a", 0, policy="q"), 0, 0)
    buf.add(sample("a", 0, n=2), 0, 1)
    with pytest.raises(BadSample, match="group_samples 3"):
        buf.add(sample("a", 1, n=3), 0, 2)
    assert buf.offsets() == {0: 1}
