"""`route`: the last stage. One Sample per policy per trajectory, for the trainer of that policy.

A trajectory that holds tokens of policies A and B becomes two Samples: one on `samples.A` whose
loss mask covers A's tokens and whose advantages carry A's sequence advantage on those tokens
(0 elsewhere), and the same for B. A trajectory without tokens of a policy yields no Sample for it,
so `group_samples` (what the trainer waits for before it treats a group as complete) counts only
the Samples actually sent to that policy's topic. Keys are group_ids, so a group stays on one
partition of each samples topic.
"""

from __future__ import annotations

import time

import numpy as np

from astraflow.errors import AstraFlowError
from astraflow.records import Sample
from streams.api import Group, owner_mask


class PipelineError(AstraFlowError):
    """The pipeline produced something route cannot use (a bug or a misconfigured pipeline)."""


def route(group: Group, now: float | None = None) -> list[Sample]:
    """The Samples of a group, all policies together, in trajectory order within each policy."""
    now = time.time() if now is None else now
    out: list[Sample] = []
    for policy in group.policies:
        if policy in group.skip_policies:
            continue
        masks = [owner_mask(t, policy) for t in group.trajectories]
        members = [i for i, m in enumerate(masks) if m.any()]
        if not members:
            continue
        adv = group.advantages.get(policy)
        if adv is None or adv.shape != (len(group),):
            raise PipelineError(
                f"group {group.group_id}: no advantages for policy {policy!r}; "
                f"the pipeline needs an advantage estimator before route"
            )
        mean, std = group.stats.get(policy, (0.0, 0.0))
        for i in members:
            t, mask = group.trajectories[i], masks[i]
            out.append(
                Sample(
                    policy=policy,
                    traj_id=t.traj_id,
                    group_id=group.group_id,
                    task_id=t.task_id,
                    env=t.env,
                    tokens=t.tokens,
                    loss_mask=mask.astype(np.uint8),
                    logprobs=t.logprobs,
                    versions=t.versions,
                    advantages=np.where(mask, np.float32(adv[i]), np.float32(0.0)).astype(np.float32),
                    reward=t.rewards[policy],
                    group_size=group.group_size,
                    group_samples=len(members),
                    group_mean=mean,
                    group_std=max(std, 0.0),
                    finish_reason=t.finish_reason,
                    attempt=t.attempt,
                    replayed=group.replayed,
                    created_at=now,
                )
            )
    return out
