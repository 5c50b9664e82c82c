"""Advantage estimators: pure functions of a group's rewards, and the stages that apply them.

Every estimator turns the rewards of one policy over the members of one group (the trajectories
holding that policy's tokens) into one sequence advantage per member; `route` broadcasts it over
the policy's tokens. Trajectories that hold several policies get one advantage per policy, each
from `rewards[policy]`, so a two-policy game trains both sides from the same group.

    grpo                   (r - mean) / (std + eps)            DeepSeekMath GRPO
    dr_grpo                r - mean                            Dr. GRPO (no std: no difficulty bias)
    rloo                   r - mean of the others              REINFORCE leave-one-out
    reinforce_pp_baseline  (r - mean) / std over recent groups REINFORCE++ with a group baseline
    reinforce_pp           (r - mean') / std' over recent groups REINFORCE++ (global baseline)

The group-relative estimators give a group whose members all got the same reward no gradient at
all. `reinforce_pp` compares each reward with the policy's recent rewards instead (mean' and std'
over a window of groups standing in for REINFORCE++'s batch): a task a deterministic policy always
fails still pushes its answer down, the way out of a state no sampled group can reveal.

std is the sample standard deviation (ddof=1, as torch.std in TRL and verl) unless `ddof` says
otherwise; a group of one member gets advantage 0 (nothing to compare with).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from streams.api import Group, Stage, StageContext


def _std(r: np.ndarray, ddof: int) -> float:
    return float(r.std(ddof=ddof)) if r.size > ddof else 0.0


def grpo(rewards: np.ndarray, eps: float = 1e-6, ddof: int = 1) -> tuple[np.ndarray, float, float]:
    """GRPO: rewards standardised within the group. Returns (advantages, mean, std)."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0:
        return np.zeros(0, np.float32), 0.0, 0.0
    mean, std = float(r.mean()), _std(r, ddof)
    return ((r - mean) / (std + eps)).astype(np.float32), mean, std


def dr_grpo(rewards: np.ndarray, ddof: int = 1) -> tuple[np.ndarray, float, float]:
    """Dr. GRPO: rewards centred on the group mean, not scaled. Returns (advantages, mean, std)."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0:
        return np.zeros(0, np.float32), 0.0, 0.0
    mean = float(r.mean())
    return (r - mean).astype(np.float32), mean, _std(r, ddof)


def rloo(rewards: np.ndarray, ddof: int = 1) -> tuple[np.ndarray, float, float]:
    """RLOO: each reward minus the mean of the other members' rewards, i.e. n/(n-1) (r - mean)."""
    r = np.asarray(rewards, dtype=np.float64)
    n = r.size
    if n == 0:
        return np.zeros(0, np.float32), 0.0, 0.0
    mean = float(r.mean())
    if n == 1:
        return np.zeros(1, np.float32), mean, 0.0
    others = (r.sum() - r) / (n - 1)
    return (r - others).astype(np.float32), mean, _std(r, ddof)


def reinforce_pp_baseline(
    rewards: np.ndarray, scale: float, eps: float = 1e-6, ddof: int = 1
) -> tuple[np.ndarray, float, float]:
    """REINFORCE++-baseline: rewards centred on the group mean, divided by `scale`, the standard
    deviation of centred rewards over a batch (here: a window of recent groups, see the stage)."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0:
        return np.zeros(0, np.float32), 0.0, 0.0
    mean = float(r.mean())
    return _scaled(r - mean, scale + eps), mean, _std(r, ddof)


def reinforce_pp(
    rewards: np.ndarray, mean: float, scale: float, eps: float = 1e-6, ddof: int = 1
) -> tuple[np.ndarray, float, float]:
    """REINFORCE++: rewards centred on `mean` and divided by `scale`, the mean and standard
    deviation of rewards over a batch (here: a window of recent groups, see the stage). Returns
    (advantages, group mean, group std) like the others."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0:
        return np.zeros(0, np.float32), 0.0, 0.0
    return _scaled(r - mean, scale + eps), float(r.mean()), _std(r, ddof)


def _scaled(centred: np.ndarray, scale: float) -> np.ndarray:
    """`centred / scale`; with a scale of 0 (every reward of the window equal, at eps 0) the
    centred rewards are all 0 and so are the advantages, not 0/0 = NaN."""
    if scale <= 0:
        return np.zeros(centred.shape, np.float32)
    return (centred / scale).astype(np.float32)


# --------------------------------------------------------------------------------------- stages


class _Estimator(Stage):
    kind = "advantage"

    def estimate(self, policy: str, rewards: np.ndarray) -> tuple[np.ndarray, float, float]:
        raise NotImplementedError

    def __call__(self, group: Group) -> Group:
        for policy in group.policies:
            members = group.members(policy)
            full = np.zeros(len(group), np.float32)
            if members.size:
                adv, mean, std = self.estimate(policy, group.rewards(policy)[members])
                full[members] = adv
                group.stats[policy] = (mean, std)
            else:
                group.stats[policy] = (0.0, 0.0)
            group.advantages[policy] = full
        return group


class GRPO(_Estimator):
    """Group-normalised advantages (mean and std of the group)."""

    def __init__(self, *, eps: float = 1e-6, ddof: int = 1) -> None:
        self.eps, self.ddof = float(eps), int(ddof)

    def estimate(self, policy: str, rewards: np.ndarray) -> tuple[np.ndarray, float, float]:
        return grpo(rewards, self.eps, self.ddof)


class DrGRPO(_Estimator):
    """Group-centred advantages, not divided by the std."""

    def __init__(self, *, ddof: int = 1) -> None:
        self.ddof = int(ddof)

    def estimate(self, policy: str, rewards: np.ndarray) -> tuple[np.ndarray, float, float]:
        return dr_grpo(rewards, self.ddof)


class RLOO(_Estimator):
    """Leave-one-out baseline."""

    def __init__(self, *, ddof: int = 1) -> None:
        self.ddof = int(ddof)

    def estimate(self, policy: str, rewards: np.ndarray) -> tuple[np.ndarray, float, float]:
        return rloo(rewards, self.ddof)


class _Windowed(_Estimator):
    """An estimator that pools values of the policy's last `window` groups (the current one
    included). The window lives in memory; after a restart it refills."""

    def __init__(self, *, window: int = 64, eps: float = 1e-6, ddof: int = 1) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self.window, self.eps, self.ddof = int(window), float(eps), int(ddof)
        self._recent: dict[str, deque[np.ndarray]] = {}

    def setup(self, ctx: StageContext) -> None:
        self._recent = {p: deque(maxlen=self.window) for p in ctx.policies}

    def _pool(self, policy: str, values: np.ndarray) -> tuple[float, float]:
        """Add this group's `values`; (mean, std) of the window's."""
        recent = self._recent.setdefault(policy, deque(maxlen=self.window))
        recent.append(values)
        pooled = np.concatenate(list(recent))
        return float(pooled.mean()), float(pooled.std(ddof=self.ddof)) if pooled.size > self.ddof else 0.0


class ReinforcePPBaseline(_Windowed):
    """Group-centred rewards scaled by the std of centred rewards over the last `window` groups
    of the same policy: the streaming stand-in for REINFORCE++'s batch normalisation."""

    def estimate(self, policy: str, rewards: np.ndarray) -> tuple[np.ndarray, float, float]:
        r = np.asarray(rewards, dtype=np.float64)
        _, scale = self._pool(policy, r - r.mean())
        return reinforce_pp_baseline(r, scale, self.eps, self.ddof)


class ReinforcePP(_Windowed):
    """Rewards centred and scaled by the mean and std of the policy's rewards over the last
    `window` groups: REINFORCE++'s batch baseline, streamed."""

    def estimate(self, policy: str, rewards: np.ndarray) -> tuple[np.ndarray, float, float]:
        r = np.asarray(rewards, dtype=np.float64)
        mean, scale = self._pool(policy, r)
        return reinforce_pp(r, mean, scale, self.eps, self.ddof)
