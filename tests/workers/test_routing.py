"""Routing of tasks to the partition with the least outstanding work (workers/routing.py): the pure
choice, a simulated pair of unlike workers under a window of work ahead, and the probe and the
feeder against the real broker (committed offsets of the worker group decide)."""

from __future__ import annotations

import collections
import zlib
from pathlib import Path
from typing import Any

import pytest

from astraflow.config import KafkaSettings
from astraflow.kafka import Publisher
from astraflow.records import Task
from tests.kafka_helpers import commit
from workers.feeder import Feeder
from workers.routing import LeastOutstanding, LoadProbe

from .conftest import make_recipe


def routing(ends: dict[int, int], done: dict[int, int] | None = None) -> LeastOutstanding:
    r = LeastOutstanding()
    r.observe(ends=ends, done=done)
    return r


def test_with_no_progress_seen_tasks_go_round_robin() -> None:
    r = routing({p: 0 for p in range(4)})
    picks = []
    for _ in range(10):
        picks.append(r.pick())
        r.sent(picks[-1])
    assert picks == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]


def test_the_least_outstanding_partition_wins_and_ties_go_in_turn() -> None:
    r = routing({0: 10, 1: 10, 2: 10}, done={0: 7, 1: 9, 2: 9})  # outstanding 3, 1, 1
    assert [r.outstanding(p) for p in range(3)] == [3, 1, 1]
    assert r.pick() == 1
    r.sent(1)
    assert r.pick() == 2  # 1 now has 2: 2 alone is least
    r.sent(2)
    assert r.pick() == 1  # 1 and 2 tie at 2: the next after 2 in turn is 0 (3), then 1
    r.observe(done={0: 10})  # partition 0's worker caught up: it gets the next ones
    assert r.pick() == 0 and r.total() == 0 + 2 + 2


def test_done_is_taken_as_read_and_ends_only_grow() -> None:
    r = routing({0: 5}, done={0: 3})
    r.sent(0)
    r.observe(ends={0: 5})  # the broker has not acknowledged the send yet: the feeder's count stays
    assert r.ends[0] == 6 and r.outstanding(0) == 3
    r.observe(done={0: 8})  # another feeder's tasks, done before this one saw them published
    assert r.outstanding(0) == 0
    r.observe(done={0: 2})  # the group's offsets were reset back: outstanding again
    assert r.outstanding(0) == 4


def test_a_partition_nobody_serves_gets_no_more_than_its_share() -> None:
    r = routing({0: 0, 1: 0, 2: 0})
    for _ in range(30):
        p = r.pick()
        r.sent(p)
        if p != 2:  # partition 2 is never done (its owner hung); the others at once
            r.observe(done={p: r.ends[p]})
    assert r.outstanding(2) == 1  # once it holds more than the others, it gets nothing more


def test_a_partition_added_to_the_topic_is_used() -> None:
    r = routing({0: 4, 1: 4}, done={0: 2, 1: 2})
    r.observe(ends={2: 0})
    assert r.pick() == 2


def test_no_partitions_is_an_error() -> None:
    with pytest.raises(ValueError):
        LeastOutstanding().pick()


def test_a_probe_that_cannot_read_keeps_the_last_view_and_backs_off(caplog: pytest.LogCaptureFixture) -> None:
    from confluent_kafka import KafkaError, KafkaException

    class Away:
        calls = 0

        def list_topics(self, *_: Any, **__: Any) -> Any:
            Away.calls += 1
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))

        def close(self) -> None:
            pass

    probe = LoadProbe(KafkaSettings(bootstrap="127.0.0.1:1"), "workers", refresh_s=0.0)
    probe.consumer.close()
    probe.consumer = Away()
    r = routing({0: 5, 1: 5}, done={0: 5, 1: 2})
    probe.refresh(r)
    probe.refresh(r)  # within the back-off: not asked again
    assert probe.failures == 1 and Away.calls == 1
    assert r.pick() == 0 and r.outstanding(1) == 3
    assert "cannot read the progress" in caplog.text


# ---------------------------------------------------------------------- a simulated pair of workers


def simulate(route: str, ticks: int = 2000, window: int = 6) -> collections.Counter[str]:
    """Tasks done per worker in `ticks` ticks: `fast` owns partitions 0-3 and runs 4 tasks at once,
    2 ticks each; `slow` owns 4-7 and runs one at a time, 16 ticks each (8x slower, as the e2e pair).
    Each tick the feeder publishes while fewer than `window` tasks are not done (admission)."""
    owner = {p: "fast" if p < 4 else "slow" for p in range(8)}
    slots, length = {"fast": 4, "slow": 1}, {"fast": 2, "slow": 16}
    queue: dict[str, collections.deque[int]] = {w: collections.deque() for w in slots}
    running: dict[str, list[list[int]]] = {w: [] for w in slots}  # [partition, ticks left]
    r = routing({p: 0 for p in range(8)})
    done_by: collections.Counter[str] = collections.Counter()
    done = dict.fromkeys(range(8), 0)
    published = 0
    for _ in range(ticks):
        while published - sum(done.values()) < window:
            # least outstanding, or by the hash of the task id as before
            p = r.pick() if route == "least_outstanding" else zlib.crc32(f"t{published}".encode()) % 8
            r.sent(p)
            queue[owner[p]].append(p)
            published += 1
        for w in slots:
            while queue[w] and len(running[w]) < slots[w]:
                running[w].append([queue[w].popleft(), length[w]])
            for job in running[w]:
                job[1] -= 1
            for job in [j for j in running[w] if j[1] == 0]:
                running[w].remove(job)
                done[job[0]] += 1  # one task at a time per partition here: done in offset order
                done_by[w] += 1
        r.observe(done=done)
    return done_by


def test_least_outstanding_gives_the_faster_worker_more_where_keys_did_not() -> None:
    by_key = simulate("task_id")
    routed = simulate("least_outstanding")
    assert by_key["fast"] < 1.5 * by_key["slow"], by_key  # the slow one paced both
    assert routed["slow"] >= 2000 // 16 - 1  # the slow one still always busy
    assert routed["fast"] >= 4 * routed["slow"], routed
    assert sum(routed.values()) >= 3 * sum(by_key.values())


# ---------------------------------------------------------------------- against the broker


@pytest.mark.broker
def test_the_probe_reads_the_worker_groups_committed_offsets(kafka: KafkaSettings, topics: Any) -> None:
    topics(["policy"])
    pub = Publisher(kafka)
    for p, n in {0: 3, 1: 5}.items():
        for i in range(n):
            pub.send(
                "tasks", Task(task_id=f"t{p}-{i}", env="arithmetic", roles={"agent": "policy"}), partition=p
            )
    pub.flush()
    commit(kafka, "workers", "tasks", {0: 3, 1: 1})
    probe = LoadProbe(kafka, "workers", refresh_s=0.1)
    r = LeastOutstanding()
    try:
        probe.refresh(r)
    finally:
        probe.close()
    assert probe.failures == 0
    assert len(r.ends) == 8 and r.ends[0] == 3 and r.ends[1] == 5
    assert [r.outstanding(p) for p in range(3)] == [0, 4, 0]  # partition 2: never committed, empty


@pytest.mark.broker
def test_the_feeder_sends_no_task_to_a_partition_its_worker_has_not_caught_up_on(
    kafka: KafkaSettings, topics: Any, tmp_path: Path
) -> None:
    topics(["policy"])
    pub = Publisher(kafka)
    for i in range(3):  # partition 5 holds 3 tasks its worker has not done; the others are done
        pub.send("tasks", Task(task_id=f"old-{i}", env="arithmetic", roles={"agent": "policy"}), partition=5)
    pub.flush()
    commit(kafka, "workers", "tasks", dict.fromkeys(range(8), 0))
    recipe = make_recipe(
        kafka=kafka.model_dump(), feeder={"env": "arithmetic", "admission": False, "max_tasks": 21}
    )
    assert Feeder(recipe, tmp_path / "run", kafka).run() == 21
    per_partition = collections.Counter(
        p for p, t in read_partitions(kafka) if isinstance(t, Task) and not t.task_id.startswith("old-")
    )
    # 7 partitions at 0 take 3 tasks each before partition 5 (at 3) ties with them
    assert per_partition == {p: 3 for p in range(8) if p != 5}, per_partition


def read_partitions(kafka: KafkaSettings) -> list[tuple[int, Any]]:
    from astraflow.kafka import TopicReader
    from astraflow.records import decode

    with TopicReader(kafka, ["tasks"], from_beginning=True) as reader:
        return [(m.partition(), decode(m.value())) for m in reader.to_end(30)]
