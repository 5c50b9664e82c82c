"""`replay` and `mix`: reuse of groups already sent to the trainer, at a ratio.

- `replay(times, delay)`: every fresh group is sent again `times` more times, the k-th time after
  k x `delay` further fresh groups (a streaming form of several epochs over the same data).
  Replayed per fresh group: `times`.
- `mix(ratio, capacity)`: keeps the last `capacity` groups and, per fresh group, adds `ratio`
  groups drawn at random from that buffer (experience replay). Replayed per fresh group: `ratio`.

A reused group is a copy with `replayed = k` and ids suffixed `~r<k>` (the trainer drops duplicate
group_ids, so the copy must be a new group), carrying its original advantages, log-probs and
versions.

Staleness: a reused sample keeps the versions that generated it, so it ages while it waits. The
trainer measures its lag like any other sample's and drops it past `max_staleness` (counted).
To avoid sending samples the trainer would drop, both stages evict a group whose lag (newest
version seen in the stream minus the group's oldest version) exceeds `max_lag` (default: the
recipe's `max_staleness`), counted as `evicted_stale`. Because the newest version seen by streams
trails the trainer's, this is an early filter, not the bound. Rule of thumb: keep
`times x delay` (replay) or `capacity` (mix) within about `max_staleness x batch_groups` fresh
groups, or most reuse is evicted. The buffers live in memory: a restarted worker starts empty
(it loses reuse opportunities, never a fresh sample), and replay ids are deterministic, so a
copy is never sent twice by one process.
"""

from __future__ import annotations

import random
from collections import Counter, deque

from streams.api import Group, Stage, StageContext
from streams.filters import MaxStaleness


class _Reuse(Stage):
    kind = "reuse"

    def __init__(self, max_lag: int | None) -> None:
        self.staleness = MaxStaleness(max_lag=max_lag)  # the filter's rule, applied to whole groups
        self.counts: Counter[str] = Counter()  # replayed, evicted_stale

    def setup(self, ctx: StageContext) -> None:
        self.staleness.setup(ctx)

    def too_stale(self, group: Group) -> bool:
        return any(self.staleness.stale(group))


class Replay(_Reuse):
    def __init__(self, *, times: int = 1, delay: int = 8, max_lag: int | None = None) -> None:
        super().__init__(max_lag)
        if times < 0 or delay < 1:
            raise ValueError("times must be >= 0 and delay >= 1")
        self.times, self.delay = int(times), int(delay)
        self.fresh = 0
        self.schedule: deque[tuple[int, int, Group]] = deque()  # (due fresh index, k, group)

    def __call__(self, group: Group) -> list[Group]:
        if group.replayed:
            return [group]
        self.fresh += 1
        out = [group]
        while self.schedule and self.schedule[0][0] <= self.fresh:
            _, k, original = self.schedule.popleft()
            if self.too_stale(original):
                self.counts["evicted_stale"] += 1
                continue
            out.append(original.replay_copy(k))
            self.counts["replayed"] += 1
        if len(group):
            for k in range(1, self.times + 1):
                self.schedule.append((self.fresh + k * self.delay, k, group))
            # several groups due at once keep their order: sort by due index (stable)
            self.schedule = deque(sorted(self.schedule, key=lambda x: x[0]))
        return out


class Mix(_Reuse):
    def __init__(
        self, *, ratio: float = 0.25, capacity: int = 64, max_lag: int | None = None, seed: int | None = None
    ) -> None:
        super().__init__(max_lag)
        if ratio < 0 or capacity < 1:
            raise ValueError("ratio must be >= 0 and capacity >= 1")
        self.ratio, self.capacity = float(ratio), int(capacity)
        self.seed = seed
        self.buffer: deque[Group] = deque(maxlen=self.capacity)
        self.uses: Counter[str] = Counter()
        self.credit = 0.0

    def setup(self, ctx: StageContext) -> None:
        super().setup(ctx)
        self.rng = random.Random(ctx.seed if self.seed is None else self.seed)

    def __call__(self, group: Group) -> list[Group]:
        if group.replayed:
            return [group]
        if not hasattr(self, "rng"):
            self.rng = random.Random(self.seed or 0)
        out = [group]
        self.credit += self.ratio
        while self.credit >= 1.0:
            self.credit -= 1.0
            fresh = [g for g in self.buffer if not self.too_stale(g)]
            self.counts["evicted_stale"] += len(self.buffer) - len(fresh)
            self.buffer = deque(fresh, maxlen=self.capacity)
            if not self.buffer:
                break
            pick = self.buffer[self.rng.randrange(len(self.buffer))]
            self.uses[pick.group_id] += 1
            out.append(pick.replay_copy(self.uses[pick.group_id]))
            self.counts["replayed"] += 1
        if len(group):
            self.buffer.append(group)
        if len(self.uses) > 4 * self.capacity:  # forget counts of groups no longer in the buffer
            self.uses = Counter({g.group_id: self.uses[g.group_id] for g in self.buffer})
        return out
