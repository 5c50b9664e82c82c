"""`LRU`: a dict with a size limit, for the streams worker's in-memory caches.

The runtime keeps the decoded trajectories of pending groups (`cache`) and the arrival time of
each pending group (`arrived`). Both are conveniences: a trajectory missing from the cache is
decoded again from the bytes in the `bodies` table, a group without an arrival time only misses
one latency observation. So when a flood of groups would grow them without end, the least
recently stored entries are dropped, and each drop is counted (`on_evict`), never silent.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    def __init__(self, max_items: int, on_evict: Callable[[], None] | None = None) -> None:
        if max_items < 1:
            raise ValueError("max_items must be positive")
        self.max_items = max_items
        self.on_evict = on_evict
        self.evicted = 0
        self._data: OrderedDict[K, V] = OrderedDict()

    def __setitem__(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.max_items:
            self._data.popitem(last=False)
            self.evicted += 1
            if self.on_evict is not None:
                self.on_evict()

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: K, default: V | None = None) -> V | None:
        return self._data.get(key, default)

    def pop(self, key: K, default: V | None = None) -> V | None:
        return self._data.pop(key, default)
