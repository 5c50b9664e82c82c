"""Filters, route, task statistics, replay and mix: pure behaviour with exact expected values."""

from __future__ import annotations

import numpy as np
import pytest

from astraflow.records import Sample, decode, encode
from streams.advantages import GRPO
from streams.api import StageContext
from streams.filters import Errored, Length, MaxStaleness, Truncated, ZeroVariance
from streams.reuse import Mix, Replay
from streams.route import PipelineError, route
from streams.stats import fold, summarize, to_record
from streams.testing import make_group, make_traj


def test_zero_variance_drops_flat_groups_only() -> None:
    flat = make_group([1.0, 1.0, 1.0])
    assert ZeroVariance()(flat) is None
    assert flat.dropped == "zero_variance" and flat.drops == {"zero_variance": 3}
    mixed = make_group([1.0, 0.0, 1.0])
    assert ZeroVariance()(mixed) is mixed and not mixed.drops


def test_zero_variance_per_policy_skips_only_the_flat_policy() -> None:
    rewards = [{"a": 1.0, "b": 0.5}, {"a": 0.0, "b": 0.5}]
    g = make_group(rewards, policies=("a", "b"))
    assert ZeroVariance()(g) is g and not g.skip_policies  # one policy has signal: keep all
    g = make_group(rewards, policies=("a", "b"))
    ZeroVariance(per_policy=True)(g)
    assert g.skip_policies == {"b"}
    GRPO()(g)
    assert {s.policy for s in route(g)} == {"a"}


def test_truncated_errored_and_length_filters() -> None:
    g = make_group([1.0, 0.0, 1.0, 0.0])
    g.trajectories[1] = make_traj("t0", 1, finish="length", rewards=0.0)
    g.trajectories[2] = make_traj("t0", 2, finish="error", rewards=1.0, error="env crashed")
    g.trajectories[3] = make_traj("t0", 3, finish="aborted", rewards=0.0)
    Truncated()(g)
    assert [t.sample_index for t in g.trajectories] == [0, 2, 3] and g.drops == {"truncated": 1}
    Errored()(g)
    assert [t.sample_index for t in g.trajectories] == [0] and g.drops["errored"] == 2

    h = make_group([1.0, 0.0, 1.0])
    h.trajectories[1] = make_traj("t0", 1, gen=50, rewards=0.0)  # 53 tokens, 50 generated
    h.trajectories[2] = make_traj("t0", 2, gen=1, rewards=1.0)  # 1 generated
    Length(max_tokens=20, min_generated=2)(h)
    assert [t.sample_index for t in h.trajectories] == [0]
    assert h.drops == {"too_long": 1, "too_short": 1}


def test_max_staleness_uses_the_newest_version_seen_per_policy() -> None:
    ctx = StageContext(policies=["policy"], max_staleness=2)
    stage = MaxStaleness()
    stage.setup(ctx)
    assert stage.max_lag == 2
    g = make_group([1.0, 0.0, 1.0])
    for i, v in enumerate([5, 3, 2]):
        g.trajectories[i] = make_traj("t0", i, version=v, rewards=float(i % 2))
        ctx.versions.observe(g.trajectories[i])
    assert ctx.versions.newest == {"policy": 5}
    stage(g)
    assert [t.sample_index for t in g.trajectories] == [0, 1] and g.drops == {"stale": 1}  # lag 3 > 2


def test_route_masks_advantages_and_group_samples() -> None:
    rewards = [{"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 1.0}, {"a": 0.0, "b": 0.0}]
    g = make_group(rewards, policies=("a", "b"), prompt=2, gen=3)
    # trajectory 2 has no tokens of b: it yields a Sample for a only
    g.trajectories[2].owner[g.trajectories[2].owner == 1] = 0
    GRPO(eps=0.0)(g)
    samples = route(g, now=123.0)
    by = {(s.policy, s.traj_id): s for s in samples}
    assert sorted(by) == [("a", "t0#0#0"), ("a", "t0#0#1"), ("a", "t0#0#2"), ("b", "t0#0#0"), ("b", "t0#0#1")]
    s = by[("a", "t0#0#0")]
    np.testing.assert_array_equal(s.loss_mask, [0, 0, 1, 1, 1, 0, 0, 0])
    a0 = (2 / 3) / np.sqrt(1 / 3)  # a: rewards [1, 0, 0], mean 1/3, sample std sqrt(1/3)
    np.testing.assert_allclose(s.advantages, [0, 0, a0, a0, a0, 0, 0, 0], rtol=1e-5)
    assert s.reward == 1.0 and s.group_samples == 3 and s.group_size == 3 and s.created_at == 123.0
    b1 = by[("b", "t0#0#1")]
    np.testing.assert_array_equal(b1.loss_mask, [0, 0, 0, 0, 0, 1, 1, 1])
    np.testing.assert_allclose(b1.advantages, [0] * 5 + [0.5 / np.sqrt(0.5)] * 3, rtol=1e-5)  # b: [0, 1]
    assert b1.group_samples == 2 and b1.group_mean == 0.5
    for s in samples:  # every Sample is a valid wire record
        assert decode(encode(s), Sample) == s


def test_route_refuses_groups_without_advantages() -> None:
    with pytest.raises(PipelineError, match="no advantages for policy 'policy'"):
        route(make_group([1.0, 0.0]))


def test_task_stats_summary_and_idempotent_fold() -> None:
    g = make_group([1.0, 0.0, 1.0, 1.0], version=3)
    s = summarize(g, success_threshold=1.0)
    assert s == {
        "gid": "t0#0",
        "task": "t0",
        "env": "arith",
        "n": 4,
        "reward_sum": 3.0,
        "successes": 3,
        "zero_variance": False,
        "version": 3,
        "dropped": False,
    }
    state, applied = fold(None, s)
    assert applied
    again, applied = fold(state, s)
    assert not applied and again == state  # a re-delivered summary counts once
    flat = summarize(make_group([0.0, 0.0], task="t0", attempt=1, version=4))
    state, _ = fold(state, dict(flat, dropped=True))  # the runtime marks groups that reach no trainer
    rec = to_record("t0", state, now=5.0)
    assert (rec.groups, rec.samples, rec.zero_variance_groups, rec.last_version) == (2, 6, 1, 4)
    assert rec.dropped_groups == 1
    assert rec.mean_reward == pytest.approx(3 / 6) and rec.success_rate == pytest.approx(3 / 6)


def _ctx() -> StageContext:
    return StageContext(policies=["policy"], max_staleness=2)


def test_replay_sends_each_group_again_after_delay() -> None:
    stage = Replay(times=2, delay=2)
    stage.setup(_ctx())
    out = [stage(make_group([1.0, 0.0], task=f"t{i}")) for i in range(6)]
    ids = [[g.group_id for g in o] for o in out]
    assert ids == [
        ["t0#0"],
        ["t1#0"],
        ["t2#0", "t0#0~r1"],
        ["t3#0", "t1#0~r1"],
        ["t4#0", "t0#0~r2", "t2#0~r1"],
        ["t5#0", "t1#0~r2", "t3#0~r1"],
    ]  # due together: FIFO
    copy = out[2][1]
    assert copy.replayed == 1 and copy.trajectories[0].traj_id == "t0#0#0~r1"
    assert stage.counts["replayed"] == 6


def test_replay_evicts_groups_past_max_lag() -> None:
    ctx = _ctx()
    stage = Replay(times=1, delay=1, max_lag=1)
    stage.setup(ctx)
    old = make_group([1.0, 0.0], version=0)
    stage(old)
    ctx.versions.observe(make_traj("x", 0, version=2))
    out = stage(make_group([1.0, 0.0], task="t1", version=2))
    assert [g.group_id for g in out] == ["t1#0"] and stage.counts["evicted_stale"] == 1


def test_mix_reuses_at_the_ratio_and_is_seeded() -> None:
    def run(seed: int) -> list[str]:
        stage = Mix(ratio=0.5, capacity=4, seed=seed)
        stage.setup(_ctx())
        ids = []
        for i in range(20):
            ids += [g.group_id for g in stage(make_group([1.0, 0.0], task=f"t{i}"))]
        return ids

    ids = run(7)
    replays = [i for i in ids if "~r" in i]
    assert len(ids) - len(replays) == 20 and len(replays) == 10  # 0.5 per fresh group
    assert ids == run(7) and ids != run(8)
    # every replay comes from the `capacity` fresh groups before the one it accompanies
    for pos, gid in enumerate(ids):
        if "~r" in gid:
            fresh_before = [i for i in ids[:pos] if "~r" not in i]
            assert gid.split("~")[0] in fresh_before[-5:-1]
