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


def test_a_workers_partitions_are_one_queue_and_its_tasks_go_to_one_of_them() -> None:
    # worker a owns 0-2 (its commits say so), b owns 3; partition 4 has no commit yet
    r = routing(dict.fromkeys(range(5), 0))
    r.observe(owners={0: "a#1", 1: "a#1", 2: "a#1", 3: "b#2"})
    assert r.queues() == [("worker a#1", [0, 1, 2]), ("worker b#2", [3]), ("partition 4", [4])]
    picks = []
    for _ in range(9):
        picks.append(r.pick())
        r.sent(picks[-1])
    # per worker, least outstanding in turn; each of a's tasks in the same partition of a's
    assert picks == [0, 3, 4] * 3, picks
    assert [r.outstanding(p) for p in range(5)] == [3, 0, 0, 3, 3]


def test_one_worker_gets_a_burst_in_one_partition() -> None:
    r = routing(dict.fromkeys(range(8), 0))
    r.observe(owners=dict.fromkeys(range(8), "w#1"))
    picks = set()
    for _ in range(24):
        picks.add(r.pick())
        r.sent(max(picks))
    assert picks == {0}  # one produce request, one fetch, one wave for a step's tasks


def test_workers_are_balanced_as_workers_not_as_partitions() -> None:
    r = routing(dict.fromkeys(range(4), 0))
    r.observe(owners={0: "a#1", 1: "a#1", 2: "a#1", 3: "b#2"})
    per = collections.Counter()
    for _ in range(40):
        p = r.pick()
        r.sent(p)
        per["a" if p < 3 else "b"] += 1
        r.observe(done={q: r.ends[q] for q in range(4)})  # both keep up
    assert per == {"a": 20, "b": 20}  # by partition a would have had 30


def test_a_partition_that_changed_hands_follows_its_new_owner() -> None:
    r = routing({0: 4, 1: 4, 2: 0}, done={0: 4, 1: 4, 2: 0})
    r.observe(owners={0: "a#1", 1: "a#1", 2: "b#2"})
    assert r.pick() == 0
    r.sent(0)
    r.observe(owners={0: "b#2"}, done={0: 5})  # a left; b committed partition 0's task
    assert r.queues() == [("worker b#2", [0, 2]), ("worker a#1", [1])]
    assert r.pick() == 1  # a's queue (partition 1 alone now) and b's both at 0: the turn after b's
    r.sent(1)
    assert r.pick() == 0  # b's, the least outstanding of its partitions
    r.sent(0)
    assert r.pick() == 1  # a tie (one each): the turn after b's
    r.sent(1)
    assert r.pick() == 0  # b's again: the partition it was given last, not its emptier one
    r.sent(0)
    # partition 1's owner is gone: nothing done there; past the tie at 2 it gets nothing more
    for _ in range(10):
        p = r.pick()
        r.sent(p)
        if p != 1:
            r.observe(done={p: r.ends[p]})
    assert r.outstanding(1) == 3 and r.outstanding(0) + r.outstanding(2) == 0


def test_a_worker_that_joined_is_found_once_the_old_tokens_of_its_partitions_age() -> None:
    from workers.routing import OWNER_TTL_S

    r = LeastOutstanding()
    r.observe(ends=dict.fromkeys(range(4), 0), owners=dict.fromkeys(range(4), "a#1"), now=0.0)
    for t in range(1, 26):  # a alone: its tasks in partition 0, done at once
        assert r.pick(now=t / 10) == 0
        r.sent(0)
        r.observe(done={0: r.ends[0]}, now=t / 10)
    # b joins and takes partitions 2 and 3, whose last commits carry a's token: nothing says they are b's
    assert r.queues(now=2.5) == [("worker a#1", [0, 1, 2, 3])]
    late = OWNER_TTL_S + 0.5  # partitions 1-3 have not moved since 0.0: each its own queue again
    assert r.queues(now=late) == [("worker a#1", [0])] + [(f"partition {p}", [p]) for p in (1, 2, 3)]
    picks = []
    for _ in range(3):
        picks.append(r.pick(now=late))
        r.sent(picks[-1])
    assert picks == [1, 2, 3]  # the aged partitions are given tasks (ties in turn after a's)
    r.observe(done={1: 1, 2: 1, 3: 1}, owners={1: "a#1", 2: "b#2", 3: "b#2"}, now=late + 0.2)
    assert r.queues(now=late + 0.2) == [("worker a#1", [0, 1]), ("worker b#2", [2, 3])]


def test_a_commit_token_names_one_process_and_fits_the_brokers_limit() -> None:
    from workers.startup import commit_token

    a, b = commit_token("worker-0"), commit_token("worker-0")
    assert a != b and a.startswith("worker-0#") and b.startswith("worker-0#")  # a restart is a new worker
    assert len(commit_token("w" * 10_000)) < 4096  # offset.metadata.max.length


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


def simulate(
    route: str, ticks: int = 2000, window: int = 6, tokens: bool = False
) -> collections.Counter[str]:
    """Tasks done per worker in `ticks` ticks: `fast` owns partitions 0-3 and runs 4 tasks at once,
    2 ticks each; `slow` owns 4-7 and runs one at a time, 16 ticks each (8x slower, as the e2e pair).
    Each tick the feeder publishes while fewer than `window` tasks are not done (admission).
    `tokens`: the commits name their worker, so routing sees two workers, not eight partitions."""
    owner = {p: "fast" if p < 4 else "slow" for p in range(8)}
    slots, length = {"fast": 4, "slow": 1}, {"fast": 2, "slow": 16}
    queue: dict[str, collections.deque[int]] = {w: collections.deque() for w in slots}
    running: dict[str, list[list[int]]] = {w: [] for w in slots}  # [partition, ticks left]
    r = routing({p: 0 for p in range(8)})
    if tokens:
        r.observe(owners={p: f"{w}#1" for p, w in owner.items()}, now=0.0)
    done_by: collections.Counter[str] = collections.Counter()
    done = dict.fromkeys(range(8), 0)
    published = 0
    for tick in range(ticks):
        now = tick / 100  # a tick is 10 ms: a token not renewed for 300 ticks has aged
        while published - sum(done.values()) < window:
            # least outstanding, or by the hash of the task id as before
            p = r.pick(now) if route == "least_outstanding" else zlib.crc32(f"t{published}".encode()) % 8
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
        r.observe(done=done, owners={p: f"{owner[p]}#1" for p in range(8)} if tokens else None, now=now)
    return done_by


def test_least_outstanding_gives_the_faster_worker_more_where_keys_did_not() -> None:
    by_key = simulate("task_id")
    routed = simulate("least_outstanding")
    assert by_key["fast"] < 1.5 * by_key["slow"], by_key  # the slow one paced both
    assert routed["slow"] >= 2000 // 16 - 1  # the slow one still always busy
    assert routed["fast"] >= 4 * routed["slow"], routed
    assert sum(routed.values()) >= 3 * sum(by_key.values())
    by_worker = simulate("least_outstanding", tokens=True)  # the same, routed to two workers
    assert by_worker["slow"] >= 2000 // 16 - 1 and by_worker["fast"] >= 4 * by_worker["slow"], by_worker
    assert sum(by_worker.values()) >= 0.95 * sum(routed.values())


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
    commit(kafka, "workers", "tasks", {0: 3, 1: 1, 2: 0}, tokens={0: "w-a#1", 2: "w-a#1"})
    probe = LoadProbe(kafka, "workers", refresh_s=0.1)
    r = LeastOutstanding()
    try:
        probe.refresh(r)
    finally:
        probe.close()
    assert probe.failures == 0
    assert len(r.ends) == 8 and r.ends[0] == 3 and r.ends[1] == 5
    assert [r.outstanding(p) for p in range(3)] == [0, 4, 0]
    # the worker that committed 0 and 2 is one queue; 1 (no token) and 3-7 (no commit) are their own
    assert r.owners == {0: "w-a#1", 2: "w-a#1"}
    assert r.queues()[:2] == [("worker w-a#1", [0, 2]), ("partition 1", [1])] and len(r.queues()) == 7


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
