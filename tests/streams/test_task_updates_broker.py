"""Poison on the streams' internal task-update topic, into a real running Faust worker: every
record is dead-lettered with its reason, and the worker keeps running and folding task statistics."""

from __future__ import annotations

import time

import msgpack
import pytest

from astraflow.records import DeadLetter, TaskStats
from streams.testing import make_traj
from tests.streams.conftest import MakeHarness

pytestmark = [pytest.mark.broker, pytest.mark.slow]

PIPELINE = [{"name": "task_stats"}, {"name": "grpo"}]
GROUP = {"timeout_s": 30.0}


def test_poison_task_updates_are_dead_lettered_and_the_worker_keeps_going(
    streams_harness: MakeHarness,
) -> None:
    h = streams_harness(["policy"], PIPELINE, group=GROUP)
    worker = h.start()
    internal = "streams-task-updates"  # namespaced like the app id: <namespace>.streams-task-updates
    good = {
        "gid": "p#0",
        "task": "p",
        "env": "arith",
        "n": 4,
        "reward_sum": 2.0,
        "successes": 2,
        "zero_variance": False,
        "version": 0,
        "dropped": False,
    }
    poison = [
        (b"p", b"\xc1 not msgpack", "not msgpack"),
        (b"p", msgpack.packb({"task": "p"}), "TaskUpdate.gid: missing"),
        (b"p", msgpack.packb([1, 2]), "not a map"),
        (b"p", msgpack.packb({**good, "n": "four"}), "TaskUpdate.n: str 'four'"),
        (b"q", msgpack.packb(good), "is not the task 'p'"),
    ]
    where = h.send([(k, v) for k, v, _ in poison], topic=internal)
    time.sleep(2.0)
    # the worker is still up and still folds: a real group's statistics come out after the poison
    h.send([(b"ok#0", make_traj("ok", i, rewards=float(i % 2))) for i in range(4)])
    stats = [r for r in h.records("task-stats", expect=1) if isinstance(r, TaskStats)]
    assert [(s.task_id, s.groups, s.samples) for s in stats] == [("ok", 1, 4)]
    assert worker.proc.poll() is None, worker.text()[-3000:]

    dead = [d for d in h.records("deadletter", expect=len(poison)) if isinstance(d, DeadLetter)]
    by_offset = {(d.partition, d.offset): d for d in dead}
    assert len(by_offset) == len(poison)
    for (key, value, phrase), at in zip(poison, where, strict=True):
        d = by_offset[at]
        assert d.source_topic == h.kafka.topic(internal) and d.component == "streams"
        assert d.raw == value and d.key == key and phrase in d.error, d.error
    values = h.last_metrics("w0", until=lambda v: v.get("task_updates.deadlettered") == len(poison))
    assert values["task_stats.published"] == 1
    assert h.stop(worker) == 0
