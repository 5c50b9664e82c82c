"""Which partition of `tasks` the feeder sends a task to: one of the worker with the least outstanding
work.

Workers share `tasks` as a consumer group, and a partition belongs to one worker at a time. Keyed by
task_id, tasks spread evenly over the partitions whatever their owners do, so a slow worker's
partitions queued tasks while a fast worker idled, and the admission window filled with tasks
waiting on the slow one: two workers, one 8x faster, did the same number of episodes
(bench/RESULTS.md, "Heterogeneous workers"). Routing makes the split follow what workers finish:
each task goes to the partition with the fewest tasks published and not yet done
(join-the-shortest-queue; ties in turn), so a partition whose owner is slow gets a task only when
it has caught up with the others, and work flows to the workers that finish it.

"Done" is the workers group's committed offset of the partition: a worker stores a task's offset
only once the broker has every trajectory of it and every earlier task of the partition is done
(workers/offsets.py), and commits it within `COMMIT_INTERVAL_MS` (workers/startup.py). So the count
needs no record of its own, and is exact in the cases that would leak a count of completions:
- a task that streams drops, or whose group times out, was still done by its worker;
- a task of a worker that dies is re-run by the partition's next owner, and is outstanding until
  then, which is what routing should see;
- a restarted feeder reads both numbers back from the broker (end offsets, committed offsets).
A partition nobody serves (one added to the topic before the group notices) only accumulates: as
soon as it holds more than the others it gets nothing more.

Workers, not partitions, are the queues: each commit carries the committing worker's token as its
metadata (`workers.startup.commit_token`), the partitions whose last commit carries the same token
are one worker's, and its tasks go to one of them (the one it was given last, while it still owns
it). librdkafka sends one produce request per partition (confluentinc/librdkafka#1700), so a step's
tasks spread over eight partitions of one worker were eight produce requests, eight fetches and
episodes that started apart; in one partition they are one of each, which cut guess_number's CPU a
step by ~5% on average (ten pairs, from 1% more to 10% less; bench/RESULTS.md). A worker with three
partitions no longer gets three shares for one. A partition with no commit yet (a new run, a new
partition) is a queue of its own; one that changed hands joins its new owner's queue with the new
owner's first commit of it. A worker's partitions other than the one it is given tasks in commit
nothing, so their tokens age: after `OWNER_TTL_S` without a move each is a queue of its own again,
is given a task when it has the fewest, and its owner's commit claims it back (a worker that joined
and took partitions whose last commit carries another worker's token is found that way).

- `LeastOutstanding`: the choice, pure (published and done offsets and owners in, a partition out).
- `LoadProbe`: reads the committed offsets with their tokens and the topic's partitions and end
  offsets from the broker, best effort: a failed read leaves the last view, whose counts can only be too high.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import Any

from astraflow.config import KafkaSettings
from astraflow.kafka import make_consumer, watermarks

log = logging.getLogger(__name__)

#: How long a partition's commit token names its owner after its committed offset last moved. The
#: partitions a worker holds but is not given tasks in commit nothing, so a token there may be that
#: of a worker that gave the partition up long ago: a worker that joins takes partitions whose last
#: commit carries another's token and would never be given a task. Past this, such a partition is a
#: queue of its own again, gets a task as soon as it has the fewest, and its owner's commit of it
#: names the owner.
OWNER_TTL_S = 3.0

#: How often the probe re-reads the partitions and end offsets of `tasks` (a new partition, another
#: feeder's tasks): one request per partition, while the committed offsets are one request for all.
#: Also how long it leaves the broker alone after a failed read.
ENDS_EVERY_S = 5.0


class LeastOutstanding:
    """Per partition, the offset past the last task published (`ends`) and past the last task done
    (`done`), and the worker that committed it last (`owners`); `pick()` a partition of the worker
    with the fewest tasks in between, ties in turn."""

    def __init__(self) -> None:
        self.ends: dict[int, int] = {}
        self.done: dict[int, int] = {}
        self.owners: dict[int, str] = {}  # partition -> the token its last commit carried
        self.moved: dict[int, float] = {}  # partition -> when its done offset or token last changed
        self._last = -1  # the partition picked last: ties go to the queue after its own
        self._sticky: dict[str, int] = {}  # queue -> the partition of it picked last

    def observe(
        self,
        ends: Mapping[int, int] | None = None,
        done: Mapping[int, int] | None = None,
        owners: Mapping[int, str] | None = None,
        now: float | None = None,
    ) -> None:
        """Merge what the broker says. An end offset only grows (the feeder's own sends may be ahead of
        what the broker has acknowledged); a done offset and an owner are taken as they are, and
        either one changing renews the owner's claim (`OWNER_TTL_S`)."""
        now = time.monotonic() if now is None else now
        for p, end in (ends or {}).items():
            self.ends[p] = max(self.ends.get(p, 0), end)
        for p, offset in (done or {}).items():
            if self.done.get(p) != offset:
                self.done[p] = offset
                self.moved[p] = now
        for p, owner in (owners or {}).items():
            if self.owners.get(p) != owner:
                self.owners[p] = owner
                self.moved[p] = now

    def sent(self, partition: int) -> None:
        self.ends[partition] = self.ends.get(partition, 0) + 1

    def outstanding(self, partition: int) -> int:
        return max(0, self.ends.get(partition, 0) - self.done.get(partition, 0))

    def total(self) -> int:
        return sum(self.outstanding(p) for p in self.ends)

    def queues(self, now: float | None = None) -> list[tuple[str, list[int]]]:
        """The partitions grouped by the worker whose commit each carries last, in the order of their
        lowest partition; a partition with no owner known, or whose commit has not moved for
        `OWNER_TTL_S`, is a queue of its own."""
        now = time.monotonic() if now is None else now
        by: dict[str, list[int]] = {}
        for p in sorted(self.ends):
            fresh = now - self.moved.get(p, -math.inf) < OWNER_TTL_S
            owner = self.owners.get(p) if fresh else None
            by.setdefault(f"worker {owner}" if owner else f"partition {p}", []).append(p)
        return list(by.items())

    def pick(self, now: float | None = None) -> int:
        """A partition of the queue (worker) with the least outstanding tasks; among equals, the first
        after the queue picked last (round robin, so that with no progress seen yet tasks spread
        evenly). Within a worker's queue, the partition it was given last while that one is still
        its own: the tasks routed to one worker go to one partition, so a burst of them travels in
        one produce request and one fetch and starts in one wave (librdkafka sends one produce
        request per partition)."""
        if not self.ends:
            raise ValueError("no partitions to route to")
        queues = self.queues(now)
        start = next((i for i, (_, parts) in enumerate(queues) if self._last in parts), -1) + 1
        turn = queues[start:] + queues[:start]
        loads = [sum(self.outstanding(p) for p in parts) for _, parts in turn]
        key, parts = turn[loads.index(min(loads))]
        sticky = self._sticky.get(key)
        if sticky not in parts:
            sticky = min(parts, key=lambda p: (self.outstanding(p), p))
        self._sticky[key] = self._last = sticky
        return sticky


class LoadProbe:
    """The workers group's progress on `tasks`, read into a `LeastOutstanding` at most every
    `refresh_s` seconds. A consumer of the workers group that never subscribes (so it never joins
    it) asks for the committed offsets, as `astraflow run`'s lag probe does (astraflow/runner/
    collector.py says why not the admin API); that needs DESCRIBE on the group (astraflow/broker/
    acls.py grants it to the feeder)."""

    def __init__(self, settings: KafkaSettings, group: str, refresh_s: float) -> None:
        self.topic = settings.topic("tasks")
        self.group = settings.group(group)
        self.refresh_s = refresh_s
        self.consumer = make_consumer(settings, group, **{"enable.auto.commit": False})
        self.lows: dict[int, int] = {}  # where a partition the group never committed is read from
        self._next = 0.0
        self._next_ends = 0.0
        self._warned = 0.0
        self.failures = 0

    def refresh(self, routing: LeastOutstanding, force: bool = False) -> None:
        from confluent_kafka import KafkaException

        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self.refresh_s
        try:
            if force or now >= self._next_ends or not routing.ends:
                self._next_ends = now + ENDS_EVERY_S
                routing.observe(ends=self._watermarks())
            done, owners = self._committed(list(routing.ends))
            routing.observe(done=done, owners=owners)
        except KafkaException as exc:
            self.failures += 1
            self._next = now + ENDS_EVERY_S  # a broker away: do not wait on it before every task
            if now >= self._warned:  # at most a line a minute: routing goes on with the last view
                self._warned = now + 60.0
                log.warning("feeder: cannot read the progress of %s on %s: %s", self.group, self.topic, exc)

    def _watermarks(self) -> dict[int, int]:
        marks = watermarks(self.consumer, self.topic)
        self.lows.update({p: low for p, (low, _) in marks.items()})
        return {p: high for p, (_, high) in marks.items()}

    def _committed(self, partitions: list[int]) -> tuple[dict[int, int], dict[int, str]]:
        """The group's committed offset of each partition, and the owner token its commit carries
        (`commit_token`: which worker committed it)."""
        from confluent_kafka import TopicPartition

        if not partitions:
            return {}, {}
        found: list[Any] = self.consumer.committed(
            [TopicPartition(self.topic, p) for p in partitions], timeout=5.0
        )
        found = [tp for tp in found if tp.error is None]
        # no commit yet (OFFSET_INVALID < 0): the group reads that partition from its first record
        done = {tp.partition: tp.offset if tp.offset >= 0 else self.lows.get(tp.partition, 0) for tp in found}
        return done, {tp.partition: tp.metadata for tp in found if tp.offset >= 0 and tp.metadata}

    def close(self) -> None:
        self.consumer.close()
