"""Groups whose trajectories list different policies: the referential game sends, per episode, a
speaker view (policies [speaker]) and a listener view (policies [listener]) into one group."""

from __future__ import annotations

import numpy as np
import pytest

from astraflow.config.streams import GroupConfig
from astraflow.records import Trajectory, encode
from streams.advantages import GRPO
from streams.api import Group
from streams.grouping import DictTable, GroupCollector
from streams.route import route
from streams.stats import summarize
from streams.testing import make_traj


def views(rewards: list[float]) -> list[Trajectory]:
    """Episode k -> speaker view at index 2k, listener view at 2k+1, both rewarded r_k."""
    out = []
    size = 2 * len(rewards)
    for k, r in enumerate(rewards):
        out.append(make_traj("game", 2 * k, group_size=size, policies=("speaker",), rewards=r))
        out.append(make_traj("game", 2 * k + 1, group_size=size, policies=("listener",), rewards=r))
    return out


def game(rewards: list[float]) -> Group:
    """The group of the views of one episode per reward, as the collector forms it."""
    trajs = views(rewards)
    return Group(
        group_id=trajs[0].group_id,
        task_id="game",
        env="arith",
        policies=["speaker", "listener"],
        group_size=len(trajs),
        trajectories=trajs,
    )


def test_views_of_different_policies_form_one_group() -> None:
    trajs = views([1.0, 0.0, 1.0, 0.0])
    collector = GroupCollector(GroupConfig(), DictTable(), DictTable())
    outcomes = [collector.add(t, encode(t), 0, now=1.0).outcome for t in trajs]
    assert outcomes == ["added"] * 8
    meta = collector.groups.get(trajs[0].group_id)
    assert meta["policies"] == ["speaker", "listener"] and len(meta["ids"]) == 8


def test_advantages_and_samples_per_policy_over_its_own_views() -> None:
    group = game([1.0, 0.0, 1.0, 0.0])
    trajs = group.trajectories
    assert list(group.members("speaker")) == [0, 2, 4, 6] and list(group.members("listener")) == [1, 3, 5, 7]
    assert np.isnan(group.rewards("speaker")[1])  # a listener view has no speaker reward
    GRPO()(group)
    expected = (np.array([1, 0, 1, 0]) - 0.5) / (np.std([1, 0, 1, 0], ddof=1) + 1e-6)
    np.testing.assert_allclose(group.advantages["speaker"][[0, 2, 4, 6]], expected, rtol=1e-5)
    assert np.all(group.advantages["speaker"][[1, 3, 5, 7]] == 0)
    samples = route(group, now=5.0)
    by_policy = {p: [s for s in samples if s.policy == p] for p in ("speaker", "listener")}
    assert [s.traj_id for s in by_policy["speaker"]] == [t.traj_id for t in trajs[0::2]]
    assert [s.traj_id for s in by_policy["listener"]] == [t.traj_id for t in trajs[1::2]]
    for s, t in zip(by_policy["listener"], trajs[1::2], strict=True):
        assert s.group_samples == 4 and s.reward == t.rewards["listener"]
        np.testing.assert_array_equal(s.loss_mask, (t.owner == 0).astype(np.uint8))
        assert s.advantages[s.loss_mask.astype(bool)] == pytest.approx(
            float(expected[trajs[1::2].index(t)]), rel=1e-5
        )


def test_task_stats_use_each_views_own_rewards() -> None:
    group = game([1.0, 1.0, 0.0, 0.0])
    s = summarize(group)
    assert s["n"] == 8 and s["reward_sum"] == 4.0 and s["successes"] == 4 and not s["zero_variance"]
