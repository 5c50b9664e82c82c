"""Validation of records, building the recipe's pipeline (names, arguments, order), the
registry of built-ins and plug-ins, and per-stage counting."""

from __future__ import annotations

import math
from collections.abc import Callable
from importlib import metadata
from typing import Any

import msgpack
import numpy as np
import pytest

from astraflow.config.base import validate_model
from astraflow.config.streams import GroupConfig, StageConfig, StreamsConfig
from astraflow.errors import ConfigError, RecordError
from astraflow.records import encode
from streams import registry
from streams.api import Group, StageContext
from streams.pipeline import StageError, build_pipeline
from streams.testing import make_group, make_traj
from streams.validate import Validate

POLICIES = frozenset({"policy"})


def ctx() -> StageContext:
    return StageContext(policies=["policy"], max_staleness=2)


def pipeline(*names: str | tuple[str, dict]) -> StreamsConfig:
    stages = [StageConfig(name=n) if isinstance(n, str) else StageConfig(name=n[0], args=n[1]) for n in names]
    return StreamsConfig(pipeline=stages)


# ---------------------------------------------------------------- validate


def test_validate_accepts_a_good_trajectory() -> None:
    t = make_traj("t0", 1, group_size=2)
    assert Validate()(encode(t), b"t0#0", POLICIES) == t


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda b: b"\x00not msgpack", "<bytes>"),
        (lambda b: {**b, "group_id": "other#0"}, "group_id"),
        (lambda b: {**b, "traj_id": "t0#0#7"}, "traj_id"),
        (lambda b: {**b, "policies": ["stranger"], "rewards": {"stranger": 1.0}}, "policies[0]"),
        (lambda b: {**b, "rewards": {"policy": math.nan}}, "rewards.policy"),
        (lambda b: {**b, "logprobs": b["logprobs"][:-1]}, "logprobs"),
        (lambda b: {**b, "t": "Sample"}, "t"),
    ],
)
def test_validate_names_the_bad_field(mutate: Callable[[dict[str, Any]], object], field: str) -> None:
    t = make_traj("t0", 1, group_size=2)
    body = msgpack.unpackb(encode(t), raw=False)
    bad = mutate(body)
    data = bad if isinstance(bad, bytes) else msgpack.packb(bad, use_bin_type=True)
    with pytest.raises(RecordError) as err:
        Validate()(data, b"t0#0", POLICIES)
    assert err.value.field == field


def test_validate_checks_the_key_and_length() -> None:
    t = make_traj("t0", 0)
    with pytest.raises(RecordError, match="Kafka key 'zzz' is not the group_id 't0#0'"):
        Validate()(encode(t), b"zzz", POLICIES)
    with pytest.raises(RecordError, match="key None"):
        Validate()(encode(t), None, POLICIES)
    Validate(check_key=False)(encode(t), None, POLICIES)
    with pytest.raises(RecordError, match="exceed the limit 4"):
        Validate(max_tokens=4)(encode(t), b"t0#0", POLICIES)
    with pytest.raises(RecordError, match="null value"):
        Validate()(None, b"t0#0", POLICIES)


# ---------------------------------------------------------------- building


def test_default_pipeline_builds() -> None:
    p = build_pipeline(StreamsConfig(), ctx())
    assert p.names == ["validate", "group", "task_stats", "errored", "grpo", "route"]
    assert p.group == GroupConfig(timeout_s=120.0, on_timeout="emit", min_size=1, dedupe_ttl_s=3600.0)
    assert (p.validate.check_ids, p.validate.check_key, p.validate.max_tokens) == (True, True, None)


def test_validate_and_group_take_their_sections() -> None:
    cfg = validate_model(
        StreamsConfig, {"validate": {"max_tokens": 64}, "group": {"timeout_s": 5, "min_size": 2}}, "r.yaml"
    )
    p = build_pipeline(cfg, ctx())
    assert p.validate.max_tokens == 64 and p.group.timeout_s == 5.0 and p.group.min_size == 2
    assert cfg.model_dump(mode="json")["validate"] == {"check_ids": True, "check_key": True, "max_tokens": 64}


@pytest.mark.parametrize(
    "stage, message",
    [
        ("validate", "'validate' is no longer a pipeline stage; put its args under streams.validate"),
        ("group", "'group' is no longer a pipeline stage; put its args under streams.group"),
        ("route", "'route' is no longer a pipeline stage; it always follows the last one .*: remove it"),
    ],
)
def test_a_stage_that_left_the_pipeline_says_where_it_went(stage: str, message: str) -> None:
    data = {"pipeline": [{"name": "errored"}, {"name": stage, "args": {}}, {"name": "grpo"}]}
    with pytest.raises(ConfigError, match=rf"r.yaml: pipeline.1: {message}"):
        validate_model(StreamsConfig, data, "r.yaml")


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        build_pipeline(pipeline("gpro"), ctx())
    msg = str(err.value)
    assert "unknown algorithm 'gpro'" in msg and "grpo" in msg and "rloo" in msg and "zero_variance" in msg
    assert "'group'" not in msg and "'route'" not in msg  # not algorithms a recipe can place


def test_bad_arguments_name_the_stage_and_key() -> None:
    with pytest.raises(
        ConfigError, match=r"pipeline\[1\] \(grpo\): unknown argument 'epsilon'.*it takes: ddof, eps"
    ):
        build_pipeline(pipeline("errored", ("grpo", {"epsilon": 1})), ctx())
    with pytest.raises(ConfigError, match=r"r.yaml: group.on_timeout: Input should be 'emit' or 'drop'"):
        validate_model(StreamsConfig, {"group": {"on_timeout": "explode"}}, "r.yaml")
    with pytest.raises(ConfigError, match=r"r.yaml: unknown key 'validate.max_token'"):
        validate_model(StreamsConfig, {"validate": {"max_token": 4}}, "r.yaml")


@pytest.mark.parametrize(
    "names, message",
    [
        (("zero_variance",), "no advantage estimator"),
        (("zero_variance", "zero_variance", "grpo"), "'zero_variance' appears more than once"),
        (("grpo", "zero_variance"), r"pipeline\[1\] \(zero_variance\): filter 'zero_variance' comes after"),
        (("grpo", "rloo"), r"pipeline\[1\] \(rloo\): a second advantage estimator 'rloo'"),
        (("replay", "grpo"), r"pipeline\[0\] \(replay\): 'replay' reuses groups before the advantage"),
    ],
)
def test_pipeline_order_is_checked(names: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_pipeline(pipeline(*names), ctx())


def test_plugins_come_from_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    class Clip:
        kind = "transform"

        def __init__(self, *, limit: float = 0.5) -> None:
            self.limit = limit

        def __call__(self, group: Group) -> Group:
            return group

    ep = metadata.EntryPoint(name="clip", value="x:Clip", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(
        registry.ALGORITHMS, "_plugins", {"clip": [ep]}
    )  # as if scanned (rules: test_registry)
    monkeypatch.setattr(registry.ALGORITHMS, "_loaded", {})  # and forgotten after this test
    monkeypatch.setattr(metadata.EntryPoint, "load", lambda self: Clip)
    assert "clip" in registry.ALGORITHMS.names()
    p = build_pipeline(pipeline(("clip", {"limit": 2.0}), "grpo"), ctx())
    assert p.names[2] == "clip" and p.stages[0][1].limit == 2.0


# ---------------------------------------------------------------- running


def test_run_counts_per_stage_and_trajectory_totals() -> None:
    p = build_pipeline(pipeline("truncated", "zero_variance", "grpo"), ctx())
    g = make_group([1.0, 0.0, 1.0, 0.0])
    g.trajectories[3] = make_traj("t0", 3, finish="length", rewards=0.0)
    out = p.run(g)
    samples = p.to_samples(out)
    assert len(samples) == 3
    flat = p.run(make_group([1.0, 1.0], task="t1"))
    assert flat == []
    v = p.counters.snapshot()
    assert v["stage.truncated.in"] == 6 and v["stage.truncated.out"] == 5
    assert v["stage.truncated.dropped.truncated"] == 1
    assert v["stage.zero_variance.dropped.zero_variance"] == 2 and v["stage.zero_variance.out"] == 3
    assert v["trajectories.out"] == 3 and v["groups.dropped"] == 1
    assert p.counters.dropped_total() == 3
    assert "stage.grpo.latency_ms.p99" in v


def test_a_failing_stage_raises_stage_error() -> None:
    p = build_pipeline(pipeline("grpo"), ctx())

    def boom(group: Group) -> Group:
        raise ZeroDivisionError("oops")

    p.stages.insert(0, ("boom", boom))
    with pytest.raises(StageError, match="stage 'boom' failed on group t0#0: ZeroDivisionError: oops"):
        p.run(make_group([1.0, 0.0]))


def test_an_observer_must_return_the_group_whole() -> None:
    class Peek:
        kind = "observe"

        def __call__(self, group: Group) -> Group:
            group.remove([True] + [False] * (len(group) - 1), "peeked")
            return group

    p = build_pipeline(pipeline("task_stats", "grpo"), ctx())
    assert len(p.to_samples(p.run(make_group([1.0, 0.0])))) == 2  # task_stats, an observer, keeps all
    p.stages.insert(0, ("peek", Peek()))
    with pytest.raises(StageError, match="stage 'peek' failed .* kind 'observe' must return the group"):
        p.run(make_group([1.0, 0.0], task="t1"))


def test_replays_are_counted_apart_from_fresh_trajectories() -> None:
    p = build_pipeline(pipeline("grpo", ("replay", {"times": 1, "delay": 1})), ctx())
    samples = []
    for i in range(3):
        samples += p.to_samples(p.run(make_group([1.0, 0.0], task=f"t{i}")))
    v = p.counters.snapshot()
    assert v["trajectories.out"] == 6 and v["trajectories.replayed"] == 4 and v["groups.replayed"] == 2
    replayed = [s for s in samples if s.replayed]
    assert [s.group_id for s in replayed] == ["t0#0~r1", "t0#0~r1", "t1#0~r1", "t1#0~r1"]
    assert np.allclose([s.advantages.sum() for s in replayed], [s.advantages.sum() for s in samples[:2] * 2])
