"""An AstraFlow data algorithm as a plug-in: subtract a per-token penalty from each policy's reward.

Placed before an advantage estimator in a recipe's streams pipeline:

    streams:
      pipeline:
        - {name: length_penalty, args: {per_token: 0.01}}
        - {name: grpo}

it discourages long answers: every trajectory loses `per_token` x (tokens that policy generated)
from `rewards[policy]`, floored at `floor`. The stage is a pure function of one group; it knows
nothing of Kafka or Faust.
"""

from __future__ import annotations

import dataclasses

from streams.api import Group, Stage, StageContext


class LengthPenalty(Stage):
    kind = "transform"  # changes rewards; runs wherever the recipe puts it

    def __init__(self, *, per_token: float = 0.01, floor: float | None = None) -> None:
        if per_token < 0:
            raise ValueError("per_token must be >= 0")
        self.per_token, self.floor = float(per_token), floor

    def setup(self, ctx: StageContext) -> None:
        self.policies = list(ctx.policies)

    def __call__(self, group: Group) -> Group:
        shaped = []
        for traj in group.trajectories:
            rewards = {}
            for i, policy in enumerate(traj.policies):
                r = traj.rewards[policy] - self.per_token * int((traj.owner == i).sum())
                rewards[policy] = r if self.floor is None else max(self.floor, r)
            shaped.append(dataclasses.replace(traj, rewards=rewards))
        group.trajectories = shaped
        return group
