"""From a stream of Samples to training batches: grouping, dedupe, staleness and safe offsets.

Pure Python, no Kafka and no torch, so every rule here is unit-tested directly:

- A group is complete when it holds `group_samples` distinct traj_ids (the count streams sent to
  this policy's topic). A repeated traj_id is a duplicate; a sample of a group already trained
  (remembered by group_id, in a bounded window saved with each checkpoint) is a duplicate too.
- Complete groups queue; a batch takes up to `batch_groups` of them, or fewer when the next would
  exceed the token budget. `trainer.order` picks which come first: `fifo`, completion order;
  `edf`, earliest deadline first, where a sample's deadline is its oldest version + max_staleness
  (the last trainer version that may still train it) and a group's is the earliest deadline among
  its samples not yet past theirs, ties in completion order. Under `edf` a group whose every sample
  is already past its deadline is dropped (counted stale, as it would be in any order) without
  taking a place in the batch, at once: with too few trainable groups for a batch, a batch of only
  such groups (no samples) is returned. Versions only grow, so a queued group's deadline is never later
  than that of a group rolled out after it: nothing waits forever.
- Staleness is judged when a batch is formed: lag = trainer version - oldest version among the
  sample's generated tokens; samples past `max_staleness` are dropped and counted, the others of
  their group still train.
- Restart offsets: for each partition, the lowest offset of a sample still waiting in an
  incomplete or queued group, or just past the last consumed message. Seeking there after a crash
  re-reads everything not yet trained; what was trained is then dropped as a duplicate.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Literal

from astraflow.records import Sample


class BadSample(ValueError):
    """A sample that cannot be trained (wrong policy, inconsistent group): goes to deadletter."""


@dataclass
class Group:
    group_id: str
    expected: int
    samples: dict[str, Sample] = field(default_factory=dict)
    offsets: list[tuple[int, int]] = field(default_factory=list)  # (partition, offset)
    oldest: list[float] = field(default_factory=list)
    """Each sample's oldest version, ascending (inf: no generated tokens, never stale); set when the
    group completes."""

    @property
    def tokens(self) -> int:
        return sum(len(s.tokens) for s in self.samples.values())

    def deadline(self, version: int, max_staleness: int) -> float:
        """The earliest deadline (oldest version + max_staleness) among the samples still trainable
        at `version`; -inf when every sample is already past its deadline."""
        for v in self.oldest:
            if v + max_staleness >= version:
                return v + max_staleness
        return -math.inf


@dataclass
class Batch:
    """The groups of one step, and the samples kept after the staleness check."""

    groups: list[Group]
    samples: list[Sample]
    lags: list[int]
    stale: list[Sample]
    formed_at: float = field(default_factory=time.time)
    """Wall time the batch was formed (the loop-breakdown bench reads it from the ledger)."""

    @property
    def group_ids(self) -> list[str]:
        return [g.group_id for g in self.groups]

    @property
    def tokens(self) -> int:
        return sum(len(s.tokens) for s in self.samples)


def lag_of(sample: Sample, version: int) -> int:
    """Version lag of a sample trained at `version` (0 if it has no generated tokens)."""
    oldest = sample.min_version()
    return max(version - oldest, 0) if oldest >= 0 else 0


Order = Literal["fifo", "edf"]
ORDERS: tuple[Order, ...] = ("fifo", "edf")


class GroupBuffer:
    """Collects one policy's samples into complete groups and hands out batches."""

    def __init__(self, policy: str, dedupe_window: int = 100_000, order: Order = "fifo") -> None:
        if order not in ORDERS:
            raise ValueError(f"unknown batch order {order!r}; known: {', '.join(ORDERS)}")
        self.policy = policy
        self.dedupe_window = dedupe_window
        self.order = order
        self.trained: OrderedDict[str, int] = OrderedDict()  # group_id -> step it was trained in
        self.pending: dict[str, Group] = {}
        self.ready: deque[str] = deque()
        self.counts: Counter[str] = Counter()
        self._next: dict[int, int] = {}  # partition -> offset after the last consumed message
        self._waiting: dict[int, list[int]] = {}  # partition -> heap of offsets still needed
        self._released: dict[int, Counter[int]] = {}
        #: (after, upto): versions after..upto were published by a run of this trainer that crashed
        #: before checkpointing them; the resumed weights do not descend from them
        self.lost: list[tuple[int, int]] = []

    # ------------------------------------------------------------------ intake

    def add(self, sample: Sample, partition: int, offset: int) -> str:
        """Take one consumed sample. Returns what happened: `pending`, `complete`, `duplicate`
        (already trained, or a repeated traj_id). Raises BadSample for unusable samples (their
        offset counts as consumed)."""
        self.consumed(partition, offset)
        if sample.policy != self.policy:
            raise BadSample(f"sample for policy {sample.policy!r} on the topic of {self.policy!r}")
        gid = sample.group_id
        if gid in self.trained:
            self.counts["samples.duplicate"] += 1
            return "duplicate"
        group = self.pending.get(gid)
        if group is None:
            group = self.pending[gid] = Group(gid, sample.group_samples)
        elif sample.group_samples != group.expected:
            raise BadSample(
                f"group {gid}: group_samples {sample.group_samples} differs from {group.expected} "
                "in earlier samples of the group"
            )
        if sample.traj_id in group.samples:
            self.counts["samples.duplicate"] += 1
            return "duplicate"
        if len(group.samples) >= group.expected:
            raise BadSample(f"group {gid}: more than group_samples={group.expected} distinct traj_ids")
        group.samples[sample.traj_id] = sample
        group.offsets.append((partition, offset))
        heapq.heappush(self._waiting.setdefault(partition, []), offset)
        self.counts["samples.in"] += 1
        if len(group.samples) == group.expected:
            versions = (s.min_version() for s in group.samples.values())
            group.oldest = sorted(v if v >= 0 else math.inf for v in versions)
            self.ready.append(gid)
            self.counts["groups.complete"] += 1
            return "complete"
        return "pending"

    def consumed(self, partition: int, offset: int) -> None:
        """Note that a message was read (also for records that never reach `add`)."""
        self._next[partition] = max(self._next.get(partition, 0), offset + 1)

    # ------------------------------------------------------------------ batches

    def take(self, max_groups: int, max_tokens: int | None, version: int, max_staleness: int) -> Batch | None:
        """The next batch, or None while not enough complete groups are queued."""
        chosen: list[str] = []
        expired: list[str] = []  # edf only: every sample past its deadline, dropped in passing
        tokens = 0
        closed = False
        for gid in self._queue(version, max_staleness):
            group = self.pending[gid]
            if self.order == "edf" and group.deadline(version, max_staleness) == -math.inf:
                expired.append(gid)
                continue
            size = group.tokens
            if max_tokens is not None and chosen and tokens + size > max_tokens:
                closed = True
                break
            chosen.append(gid)
            tokens += size
            if len(chosen) == max_groups:
                closed = True
                break
        if not closed and (max_tokens is None or tokens < max_tokens or not chosen):
            if not expired:
                return None  # ran out of queued groups without closing the batch
            # Too few trainable groups for a batch, but some that can never train: drop those now.
            # Kept until a batch closed, they held places in the feeder's admission window, which
            # then admitted nothing new, so no batch ever closed (the fault tests' stall: groups a
            # crashed emission delivered late sat in the queue while the trainer polled for ever).
            chosen = []
        taken = {*expired, *chosen}
        self.ready = deque(gid for gid in self.ready if gid not in taken)
        groups = [self.pending[gid] for gid in (*expired, *chosen)]
        kept, lags, stale = [], [], []
        for g in groups:
            for s in g.samples.values():
                lag = lag_of(s, version)
                if lag > max_staleness or self._from_lost(s):
                    stale.append(s)
                else:
                    kept.append(s)
                    lags.append(lag)
        self.counts["samples.stale"] += len(stale)
        return Batch(groups, kept, lags, stale)

    def lose_versions(self, after: int, upto: int) -> None:
        """Versions after..upto are lost (see trainer/service.py): their samples are stale."""
        self.lost.append((after, upto))

    def _from_lost(self, sample: Sample) -> bool:
        if not self.lost:
            return False
        versions = sample.versions[sample.loss_mask.astype(bool)]
        return any(bool(((versions > after) & (versions <= upto)).any()) for after, upto in self.lost)

    def _queue(self, version: int, max_staleness: int) -> list[str]:
        """Queued group ids in the order batches take them (sorted() is stable: ties stay in
        completion order)."""
        if self.order == "fifo":
            return list(self.ready)
        return sorted(self.ready, key=lambda gid: self.pending[gid].deadline(version, max_staleness))

    def done(self, batch: Batch, step: int) -> None:
        """The batch was trained at `step` (or dropped): remember its groups, release offsets."""
        for g in batch.groups:
            del self.pending[g.group_id]
            self.trained[g.group_id] = step
            for partition, offset in g.offsets:
                self._released.setdefault(partition, Counter())[offset] += 1
        while len(self.trained) > self.dedupe_window:
            self.trained.popitem(last=False)
        self.counts["groups.trained"] += len(batch.groups)

    # ------------------------------------------------------------------ checkpoint state

    def offsets(self) -> dict[int, int]:
        """Per partition, where a restarted trainer must resume reading."""
        out = {}
        for partition, nxt in self._next.items():
            heap, released = self._waiting.get(partition, []), self._released.get(partition, Counter())
            while heap and released[heap[0]]:
                released[heap[0]] -= 1
                heapq.heappop(heap)
            out[partition] = heap[0] if heap else nxt
        return out

    def state(self) -> dict[str, Any]:
        return {
            "offsets": {str(p): o for p, o in sorted(self.offsets().items())},
            "trained": [[gid, step] for gid, step in self.trained.items()],
            "counts": dict(self.counts),
            "lost": [list(r) for r in self.lost],
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's state (before anything was consumed)."""
        self._next = {int(p): int(o) for p, o in state.get("offsets", {}).items()}
        self.trained = OrderedDict((str(g), int(s)) for g, s in state.get("trained", []))
        self.counts = Counter({str(k): int(v) for k, v in state.get("counts", {}).items()})
        self.lost = [(int(a), int(b)) for a, b in state.get("lost", [])]
