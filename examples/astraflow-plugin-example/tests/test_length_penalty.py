"""Unit tests of the plug-in's stage, and the model for testing a data algorithm: build groups with
`streams.testing`, call the stage, check what it did. No Kafka, no Faust, no worker.
(tests/streams/test_plugin_broker.py installs the package and runs it in a real worker.)"""

from __future__ import annotations

import numpy as np
import pytest
from astraflow_plugin_example import LengthPenalty

from streams.advantages import DrGRPO
from streams.api import Group, StageContext
from streams.testing import make_group, make_traj


def test_each_generated_token_costs_per_token() -> None:
    group = LengthPenalty(per_token=0.1)(make_group([1.0, 0.0], gen=5))
    assert group.rewards("policy") == pytest.approx([0.5, -0.5])  # the 3 prompt tokens are free


def test_longer_answers_lose_more() -> None:
    trajs = [make_traj("t0", 0, group_size=2, gen=4), make_traj("t0", 1, group_size=2, gen=20)]
    group = Group(
        group_id="t0#0", task_id="t0", env="arith", policies=["policy"], group_size=2, trajectories=trajs
    )
    stage = LengthPenalty(per_token=0.01)
    stage.setup(StageContext(policies=["policy"], max_staleness=0))  # what the worker does first
    out = stage(group)
    assert out.rewards("policy") == pytest.approx([1.0 - 0.04, 1.0 - 0.2])
    # only the rewards change: same trajectories, same tokens, nothing dropped
    assert [t.traj_id for t in out.trajectories] == ["t0#0#0", "t0#0#1"] and not out.drops
    for before, after in zip(trajs, out.trajectories, strict=True):
        np.testing.assert_array_equal(after.tokens, before.tokens)


def test_each_policy_pays_for_its_own_tokens() -> None:
    # two policies take turns: 3 prompt tokens, then 5 of "a", then 5 of "b"
    group = make_group([{"a": 1.0, "b": 2.0}, {"a": 0.0, "b": 0.0}], policies=("a", "b"), gen=5)
    LengthPenalty(per_token=0.1)(group)
    assert group.rewards("a") == pytest.approx([0.5, -0.5])
    assert group.rewards("b") == pytest.approx([1.5, -0.5])


def test_the_floor_bounds_the_shaped_reward() -> None:
    group = LengthPenalty(per_token=0.1, floor=0.0)(make_group([1.0, 0.2, -1.0], gen=5))
    assert group.rewards("policy") == pytest.approx([0.5, 0.0, 0.0])


def test_before_the_estimator_the_shorter_of_two_right_answers_wins() -> None:
    trajs = [make_traj("t0", 0, group_size=2, gen=5), make_traj("t0", 1, group_size=2, gen=15)]
    group = Group(
        group_id="t0#0", task_id="t0", env="arith", policies=["policy"], group_size=2, trajectories=trajs
    )
    out = DrGRPO()(LengthPenalty(per_token=0.1)(group))  # both rewards 1.0: no signal without the penalty
    assert out is not None
    np.testing.assert_allclose(out.advantages["policy"], [0.5, -0.5])  # 0.5 and -0.5, minus their mean 0


def test_a_negative_penalty_is_refused() -> None:
    with pytest.raises(ValueError, match="per_token must be >= 0"):
        LengthPenalty(per_token=-0.1)
