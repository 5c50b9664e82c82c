"""Which task offsets a worker may commit, when tasks finish out of order.

A worker runs many tasks of one partition at once and they finish in any order. Committing offset
N+1 tells Kafka that every task up to N is done, so the committable position of a partition is the
smallest offset still in flight (or one past the highest finished offset when nothing is in flight).
`OffsetTracker` is that bookkeeping, pure and without Kafka.
"""

from __future__ import annotations

import heapq


class OffsetTracker:
    """Per-partition in-flight offsets and the position that is safe to commit."""

    def __init__(self) -> None:
        self._inflight: dict[int, set[int]] = {}
        self._heap: dict[int, list[int]] = {}
        self._high: dict[int, int] = {}  # highest offset finished or started, per partition

    def start(self, partition: int, offset: int) -> None:
        self._inflight.setdefault(partition, set()).add(offset)
        heapq.heappush(self._heap.setdefault(partition, []), offset)
        self._high[partition] = max(self._high.get(partition, -1), offset)

    def finish(self, partition: int, offset: int) -> int | None:
        """Mark one offset done. Returns the new committable position of its partition (the next
        offset to consume) if it moved, else None."""
        live = self._inflight.get(partition)
        if live is None or offset not in live:
            return None
        before = self.position(partition)
        live.discard(offset)
        after = self.position(partition)
        return after if after != before else None

    def position(self, partition: int) -> int | None:
        """Next offset to consume on `partition` such that every earlier task is done."""
        heap = self._heap.get(partition)
        live = self._inflight.get(partition, set())
        while heap and heap[0] not in live:
            heapq.heappop(heap)
        if heap:
            return heap[0]
        high = self._high.get(partition)
        return None if high is None else high + 1

    def inflight(self, partition: int | None = None) -> int:
        if partition is not None:
            return len(self._inflight.get(partition, ()))
        return sum(len(s) for s in self._inflight.values())

    def forget(self, partition: int) -> list[int]:
        """Drop a partition (revoked); returns the offsets that were still in flight."""
        live = sorted(self._inflight.pop(partition, set()))
        self._heap.pop(partition, None)
        self._high.pop(partition, None)
        return live
