"""What the feeder remembers, kept exact across a SIGKILL and bounded in memory.

- `published_since(reader, topic, ends)`: the group ids of the Tasks on `tasks` after the end
  offsets the feeder saved with its position. The feeder saves its position only every 64 tasks
  (a save per task would cost a disk write per task); a feeder killed between two saves restarts
  from the older position, and these are the tasks it published since: it skips them when its
  deterministic source yields them again, so no task is published twice. (A duplicate task would
  be dropped by streams as a duplicate group and never counted as consumed, so the admission
  window would leak shut: a chaos run hung at step 81 that way.)
- `StatsCache`: the newest TaskStats of at most `max_tasks` tasks, least recently updated evicted
  first (selective rollout only needs the tasks it still sees), and the running total of groups
  that reached no trainer, which admission counts as consumed and which survives eviction.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

from astraflow.kafka import TopicReader
from astraflow.records import RecordError, Task, TaskStats, decode

log = logging.getLogger(__name__)


def published_since(
    reader: TopicReader, topic: str, ends: dict[int, int], highs: dict[int, int], timeout: float = 60.0
) -> set[str]:
    """Group ids of the Tasks in `topic` from offsets `ends` (partition -> offset; a partition
    not named is read from its start) up to `highs` (the end offsets now). `reader` is a fresh
    TopicReader this function assigns and leaves assigned."""
    from confluent_kafka import TopicPartition

    todo = {p: (ends.get(p, 0), high) for p, high in highs.items() if high > ends.get(p, 0)}
    if not todo:
        return set()
    reader.consumer.assign([TopicPartition(topic, p, start) for p, (start, _) in todo.items()])
    seen: set[str] = set()
    left = {p: high for p, (_, high) in todo.items()}
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        msg = reader.poll(0.2)
        if msg is None:
            continue
        p = msg.partition()
        if msg.offset() + 1 >= left.get(p, 0):
            left.pop(p, None)
        try:
            task = decode(msg.value() or b"", Task)
        except RecordError:
            continue  # not ours to judge: the workers dead-letter it
        seen.add(task.group_id)
    if left:
        raise TimeoutError(
            f"{topic}: could not read the tasks published since the last save within "
            f"{timeout:.0f} s (partitions {sorted(left)})"
        )
    return seen


class StatsCache:
    """TaskStats by task_id, at most `max_tasks` of them (least recently updated evicted first).

    `dropped` is the total of `dropped_groups` over every task ever seen: each record adds what
    it says beyond the record it replaces, or all of it when the record counts from zero again
    (streams evicted the task's statistics). A task evicted here and seen again counts from zero,
    so its earlier drops are counted twice; admission then lets a few more groups ahead (never
    fewer), which can delay a stale sample, never hang the run."""

    def __init__(self, max_tasks: int) -> None:
        self.max_tasks = max_tasks
        self._items: OrderedDict[str, TaskStats] = OrderedDict()
        self.dropped = 0
        self.evicted = 0

    def put(self, rec: TaskStats) -> None:
        old = self._items.pop(rec.task_id, None)
        # streams deletes the statistics of tasks it has not seen for long (streams.max_task_stats):
        # such a task comes back counting from zero, and its new drops are all new
        before = old.dropped_groups if old is not None and rec.groups >= old.groups else 0
        self.dropped += rec.dropped_groups - (before if rec.dropped_groups >= before else 0)
        self._items[rec.task_id] = rec
        while len(self._items) > self.max_tasks:
            self._items.popitem(last=False)
            self.evicted += 1

    def get(self, task_id: str) -> TaskStats | None:
        return self._items.get(task_id)

    def __len__(self) -> int:
        return len(self._items)
