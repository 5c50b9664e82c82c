"""Which partition of `tasks` the feeder sends a task to: the one with the least outstanding work.

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

- `LeastOutstanding`: the choice, pure (published and done offsets in, a partition out).
- `LoadProbe`: reads the committed offsets and the topic's partitions and end offsets from the
  broker, best effort: a failed read leaves the last view, whose counts can only be too high.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from astraflow.config import KafkaSettings
from astraflow.kafka import make_consumer, watermarks

log = logging.getLogger(__name__)

#: How often the probe re-reads the partitions and end offsets of `tasks` (a new partition, another
#: feeder's tasks): one request per partition, while the committed offsets are one request for all.
#: Also how long it leaves the broker alone after a failed read.
ENDS_EVERY_S = 5.0


class LeastOutstanding:
    """Per partition, the offset past the last task published (`ends`) and past the last task done
    (`done`); `pick()` the partition with the fewest tasks in between, ties in turn."""

    def __init__(self) -> None:
        self.ends: dict[int, int] = {}
        self.done: dict[int, int] = {}
        self._last = -1  # the partition picked last: ties go to the next one after it

    def observe(self, ends: Mapping[int, int] | None = None, done: Mapping[int, int] | None = None) -> None:
        """Merge what the broker says. An end offset only grows (the feeder's own sends may be ahead of
        what the broker has acknowledged); a done offset is taken as it is."""
        for p, end in (ends or {}).items():
            self.ends[p] = max(self.ends.get(p, 0), end)
        self.done.update(done or {})

    def sent(self, partition: int) -> None:
        self.ends[partition] = self.ends.get(partition, 0) + 1

    def outstanding(self, partition: int) -> int:
        return max(0, self.ends.get(partition, 0) - self.done.get(partition, 0))

    def total(self) -> int:
        return sum(self.outstanding(p) for p in self.ends)

    def pick(self) -> int:
        """The partition with the least outstanding tasks; among equals, the first after the one
        picked last (round robin, so that with no progress seen yet tasks spread evenly)."""
        if not self.ends:
            raise ValueError("no partitions to route to")
        parts = sorted(self.ends)
        start = next((i for i, p in enumerate(parts) if p > self._last), 0)
        turn = parts[start:] + parts[:start]
        least = min(self.outstanding(p) for p in turn)
        self._last = next(p for p in turn if self.outstanding(p) == least)
        return self._last


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
            routing.observe(done=self._committed(list(routing.ends)))
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

    def _committed(self, partitions: list[int]) -> dict[int, int]:
        from confluent_kafka import TopicPartition

        if not partitions:
            return {}
        found: list[Any] = self.consumer.committed(
            [TopicPartition(self.topic, p) for p in partitions], timeout=5.0
        )
        # no commit yet (OFFSET_INVALID < 0): the group reads that partition from its first record
        return {
            tp.partition: tp.offset if tp.offset >= 0 else self.lows.get(tp.partition, 0)
            for tp in found
            if tp.error is None
        }

    def close(self) -> None:
        self.consumer.close()
