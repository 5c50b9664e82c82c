"""Golden values of the advantage estimators, per policy on multi-policy groups."""

from __future__ import annotations

import numpy as np
import pytest

from streams.advantages import (
    GRPO,
    RLOO,
    DrGRPO,
    ReinforcePP,
    ReinforcePPBaseline,
    dr_grpo,
    grpo,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
)
from streams.api import StageContext
from streams.testing import make_group, make_traj

R = np.array([1.0, 0.0, 0.0, 0.0])  # mean 0.25, sample std 0.5


def test_grpo_golden() -> None:
    adv, mean, std = grpo(R, eps=0.0)
    np.testing.assert_allclose(adv, [1.5, -0.5, -0.5, -0.5], rtol=1e-6)
    assert (mean, std) == (0.25, 0.5)
    assert adv.dtype == np.float32
    adv, _, std = grpo(R, eps=0.0, ddof=0)  # population std sqrt(0.1875)
    np.testing.assert_allclose(adv, np.array([0.75, -0.25, -0.25, -0.25]) / np.sqrt(0.1875), rtol=1e-6)


def test_grpo_eps_guards_constant_groups() -> None:
    adv, mean, std = grpo(np.array([1.0, 1.0, 1.0]))
    np.testing.assert_array_equal(adv, [0.0, 0.0, 0.0])
    assert (mean, std) == (1.0, 0.0)


def test_dr_grpo_golden() -> None:
    adv, mean, std = dr_grpo(R)
    np.testing.assert_allclose(adv, [0.75, -0.25, -0.25, -0.25], rtol=1e-6)
    assert (mean, std) == (0.25, 0.5)


def test_rloo_golden() -> None:
    adv, mean, _ = rloo(R)
    np.testing.assert_allclose(adv, [1.0, -1 / 3, -1 / 3, -1 / 3], rtol=1e-6)
    np.testing.assert_allclose(adv, 4 / 3 * (R - R.mean()), rtol=1e-6)  # n/(n-1) (r - mean)
    adv, _, _ = rloo(np.array([2.0, 0.5, -1.0]))
    np.testing.assert_allclose(adv, [2.0 - (-0.25), 0.5 - 0.5, -1.0 - 1.25], rtol=1e-6)


def test_reinforce_pp_baseline_golden() -> None:
    adv, mean, _ = reinforce_pp_baseline(R, scale=0.5, eps=0.0)
    np.testing.assert_allclose(adv, [1.5, -0.5, -0.5, -0.5], rtol=1e-6)
    assert mean == 0.25


def test_single_member_and_empty_groups_get_zero() -> None:
    for fn in (grpo, dr_grpo, rloo):
        adv, mean, std = fn(np.array([0.7]))
        np.testing.assert_array_equal(adv, [0.0])
        assert mean == pytest.approx(0.7) and std == 0.0
        assert fn(np.zeros(0))[0].shape == (0,)


def test_reinforce_pp_stage_scales_by_window_of_groups() -> None:
    stage = ReinforcePPBaseline(window=2, eps=0.0)
    stage.setup(StageContext(policies=["policy"], max_staleness=1))
    a = stage(make_group([1.0, 0.0]))
    # centred [0.5, -0.5]: sample std sqrt(0.5)
    np.testing.assert_allclose(a.advantages["policy"], [0.5 / np.sqrt(0.5), -0.5 / np.sqrt(0.5)], rtol=1e-6)
    b = stage(make_group([1.0, 1.0, 0.0, 0.0], task="t1"))
    # pooled centred rewards of both groups: three 0.5 and three -0.5, sample std sqrt(0.3)
    np.testing.assert_allclose(
        b.advantages["policy"], np.array([0.5, 0.5, -0.5, -0.5]) / np.sqrt(0.3), rtol=1e-6
    )
    stage(make_group([1.0, 0.0, 0.0, 0.0], task="t2"))
    c = stage(make_group([1.0, 0.0], task="t3"))  # window of 2: the first group has left it
    pooled = np.array([0.75, -0.25, -0.25, -0.25, 0.5, -0.5])
    np.testing.assert_allclose(c.advantages["policy"], np.array([0.5, -0.5]) / pooled.std(ddof=1), rtol=1e-6)


def test_estimators_are_per_policy_on_multi_policy_groups() -> None:
    rewards = [
        {"solver": 1.0, "verifier": 0.0},
        {"solver": 0.0, "verifier": 1.0},
        {"solver": 0.0, "verifier": 1.0},
        {"solver": 0.0, "verifier": 1.0},
    ]
    g = make_group(rewards, policies=("solver", "verifier"))
    GRPO(eps=0.0)(g)
    np.testing.assert_allclose(g.advantages["solver"], [1.5, -0.5, -0.5, -0.5], rtol=1e-6)
    np.testing.assert_allclose(g.advantages["verifier"], [-1.5, 0.5, 0.5, 0.5], rtol=1e-6)
    assert g.stats == {"solver": (0.25, 0.5), "verifier": (0.75, 0.5)}


def test_members_without_a_policy_are_left_out_of_its_baseline() -> None:
    # trajectory 2 holds only solver tokens: the verifier's statistics come from 0, 1 and 3
    trajs = [
        make_traj(
            "t0",
            i,
            group_size=4,
            policies=("solver", "verifier"),
            rewards={"solver": float(i == 0), "verifier": float(i)},
        )
        for i in range(4)
    ]
    only_solver = make_traj(
        "t0", 2, group_size=4, policies=("solver", "verifier"), rewards={"solver": 0.0, "verifier": 99.0}
    )
    only_solver.owner[only_solver.owner == 1] = 0
    trajs[2] = only_solver
    g = make_group([0.0] * 4, policies=("solver", "verifier"))
    g.trajectories = trajs
    DrGRPO()(g)
    np.testing.assert_allclose(g.advantages["verifier"], [0 - 4 / 3, 1 - 4 / 3, 0.0, 3 - 4 / 3], rtol=1e-6)
    np.testing.assert_allclose(g.advantages["solver"], [0.75, -0.25, -0.25, -0.25], rtol=1e-6)
    RLOO()(g)
    assert g.stats["verifier"][0] == pytest.approx(4 / 3)


def test_reinforce_pp_golden() -> None:
    adv, mean, std = reinforce_pp(R, mean=0.5, scale=0.25, eps=0.0)
    np.testing.assert_allclose(adv, [2.0, -2.0, -2.0, -2.0], rtol=1e-6)
    assert (mean, std) == (0.25, 0.5)  # the group's own, as the other estimators report


def test_reinforce_pp_moves_a_group_that_always_failed() -> None:
    # what group baselines cannot do: a group whose members all got 0 after groups that won is
    # pushed down, one that all won after groups that failed is pushed up
    stage = ReinforcePP(window=3, eps=0.0)
    stage.setup(StageContext(policies=["policy"], max_staleness=1))
    first = stage(make_group([1.0, 1.0]))  # a window of equal rewards: std 0, advantages 0 (not 0/0)
    assert first.advantages["policy"].tolist() == [0.0, 0.0]
    lost = stage(make_group([0.0, 0.0], task="t1"))
    pooled = np.array([1.0, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(lost.advantages["policy"], [-0.5 / pooled.std(ddof=1)] * 2, rtol=1e-6)
    assert grpo(np.array([0.0, 0.0]))[0].tolist() == [0.0, 0.0]
    stage(make_group([0.0, 0.0], task="t2"))
    won = stage(make_group([1.0, 1.0], task="t3"))  # window of 3: the first group has left it
    pooled = np.array([0.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    np.testing.assert_allclose(
        won.advantages["policy"], [(1.0 - pooled.mean()) / pooled.std(ddof=1)] * 2, rtol=1e-6
    )


def test_reinforce_pp_keeps_a_window_per_policy() -> None:
    stage = ReinforcePP(window=8, eps=0.0)
    stage.setup(StageContext(policies=["a", "b"], max_staleness=1))
    stage.estimate("a", np.array([1.0, 1.0, 1.0]))
    adv, _, _ = stage.estimate("b", np.array([1.0, 0.0]))  # a's wins are not b's baseline
    np.testing.assert_allclose(adv, [0.5 / np.sqrt(0.5), -0.5 / np.sqrt(0.5)], rtol=1e-6)
