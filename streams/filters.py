"""Filters: drop trajectories or whole groups that would teach the trainer nothing or mislead it.

Each is a pure decision over one group; what it removes is counted under the filter's reason
(`zero_variance`, `truncated`, `errored`, `stale`, `too_long`, `too_short`).

- `zero_variance`: every member has the same reward (for every policy): the advantage is 0
  everywhere. With `per_policy`, a policy whose rewards are constant gets no Samples from the group
  while the other policies keep theirs.
- `truncated`: finish_reason is `length` (the answer was cut off).
- `errored`: finish_reason is `error` or `aborted`, or the worker attached an error.
- `max_staleness`: the oldest generating version of a trajectory lags the newest version seen in
  the stream by more than `max_lag` (default: the recipe's `max_staleness`).
- `length`: total tokens above `max_tokens`, or generated tokens outside [min_generated, max_generated].
"""

from __future__ import annotations

import numpy as np

from streams.api import Group, Stage, StageContext


def constant(rewards: np.ndarray, atol: float = 1e-9) -> bool:
    """True if all rewards are equal (within atol); an empty or single reward is constant."""
    r = np.asarray(rewards, dtype=np.float64)
    return r.size < 2 or float(r.max() - r.min()) <= atol


class ZeroVariance(Stage):
    kind = "filter"

    def __init__(self, *, per_policy: bool = False, atol: float = 1e-9) -> None:
        self.per_policy, self.atol = bool(per_policy), float(atol)

    def __call__(self, group: Group) -> Group | None:
        flat = [p for p in group.policies if constant(group.rewards(p)[group.members(p)], self.atol)]
        if len(flat) == len(group.policies):
            group.drop("zero_variance")
            return None
        if self.per_policy:
            group.skip_policies.update(flat)
        return group


class Truncated(Stage):
    kind = "filter"

    def __init__(self, *, reasons: list[str] | None = None) -> None:
        self.reasons = set(reasons or ["length"])

    def __call__(self, group: Group) -> Group:
        group.remove([t.finish_reason in self.reasons for t in group.trajectories], "truncated")
        return group


class Errored(Stage):
    kind = "filter"

    def __call__(self, group: Group) -> Group:
        group.remove(
            [t.finish_reason in ("error", "aborted") or t.error is not None for t in group.trajectories],
            "errored",
        )
        return group


class MaxStaleness(Stage):
    kind = "filter"

    def __init__(self, *, max_lag: int | None = None) -> None:
        if max_lag is not None and max_lag < 0:
            raise ValueError("max_lag must be >= 0")
        self.max_lag = max_lag

    def setup(self, ctx: StageContext) -> None:
        if self.max_lag is None:
            self.max_lag = ctx.max_staleness
        self.versions = ctx.versions

    def stale(self, group: Group) -> list[bool]:
        """Per trajectory: whether its lag exceeds `max_lag` (the reuse stages evict by it too)."""
        limit = self.max_lag if self.max_lag is not None else 0
        return [self.versions.lag(t) > limit for t in group.trajectories]

    def __call__(self, group: Group) -> Group:
        group.remove(self.stale(group), "stale")
        return group


class Length(Stage):
    kind = "filter"

    def __init__(
        self, *, max_tokens: int | None = None, min_generated: int = 0, max_generated: int | None = None
    ) -> None:
        self.max_tokens, self.min_generated, self.max_generated = (
            max_tokens,
            int(min_generated),
            max_generated,
        )

    def __call__(self, group: Group) -> Group:
        generated = np.array([int((t.owner >= 0).sum()) for t in group.trajectories], dtype=np.int64)
        total = np.array([len(t.tokens) for t in group.trajectories], dtype=np.int64)
        too_long = np.zeros(len(group), bool)
        if self.max_tokens is not None:
            too_long |= total > self.max_tokens
        if self.max_generated is not None:
            too_long |= generated > self.max_generated
        group.remove(too_long, "too_long")
        if self.min_generated:
            short = np.array(
                [int((t.owner >= 0).sum()) < self.min_generated for t in group.trajectories], bool
            )
            group.remove(short, "too_short")
        return group
