"""A real `astraflow streams` Faust worker against the real broker: exactly the expected Samples
with the expected advantages on each samples.<policy>, every malformed record in `deadletter`,
counts that add up, group timeouts, and the same input sent twice (also across a restart)
yielding no duplicate Sample."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from astraflow.config import KafkaSettings
from astraflow.records import DeadLetter, Sample, TaskStats, Trajectory, TrajectoryBatch, encode
from streams.advantages import grpo
from streams.testing import make_traj
from tests.streams.conftest import MakeHarness

pytestmark = [pytest.mark.broker, pytest.mark.slow]

POLICIES = ["solver", "verifier"]
PIPELINE: list[dict[str, Any]] = [
    {"name": "task_stats"},
    {"name": "truncated"},
    {"name": "zero_variance"},
    {"name": "grpo", "args": {"eps": 1e-6}},
]
GROUP = {"timeout_s": 4.0, "min_size": 2}
SOLVER = [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 1], [1, 0, 1, 0], [0.5, 0, 1, 0.25], [1, 0, 0, 1]]
VERIFIER = [[0, 1, 1, 1], [1, 1, 1, 0], [0, 0, 1, 1], [0.2, 0.4, 0.6, 0.8], [1, 0, 0, 0], [1, 1, 0, 0]]


def traj(task: str, i: int, solver: float, verifier: float, **kw: Any) -> Trajectory:
    return make_traj(
        task,
        i,
        group_size=4,
        policies=tuple(POLICIES),
        rewards={"solver": solver, "verifier": verifier},
        **kw,
    )


def good_input() -> tuple[list, dict[str, dict[str, float]]]:
    """The well-formed trajectories, and the advantage expected for each (policy, traj_id)."""
    items, expected = [], {"solver": {}, "verifier": {}}
    for g in range(6):
        trajs = [traj(f"g{g}", i, SOLVER[g][i], VERIFIER[g][i]) for i in range(4)]
        if g == 5:  # the last member holds only solver tokens: the verifier's group is 3 samples
            trajs[3].owner[trajs[3].owner == 1] = 0
        items += trajs
        adv, _, _ = grpo(np.array(SOLVER[g], float), eps=1e-6)
        expected["solver"].update({t.traj_id: float(a) for t, a in zip(trajs, adv, strict=True)})
        members = trajs[:3] if g == 5 else trajs
        adv, _, _ = grpo(np.array(VERIFIER[g][: len(members)], float), eps=1e-6)
        expected["verifier"].update({t.traj_id: float(a) for t, a in zip(members, adv, strict=True)})
    items += [traj("zero", i, 1.0, 1.0) for i in range(4)]  # zero variance: dropped
    truncated = [
        traj("trunc", i, float(i % 2), float(i % 3 == 0), finish="length" if i == 2 else "stop")
        for i in range(4)
    ]
    items += truncated
    kept = [truncated[i] for i in (0, 1, 3)]
    for p, rewards in (("solver", [0.0, 1.0, 1.0]), ("verifier", [1.0, 0.0, 1.0])):
        adv, _, _ = grpo(np.array(rewards), eps=1e-6)
        expected[p].update({t.traj_id: float(a) for t, a in zip(kept, adv, strict=True)})
    partial = [traj("partial", i, float(i), 1.0 - i) for i in range(2)]  # 2 of 4: emitted by timeout
    items += partial
    for p, rewards in (("solver", [0.0, 1.0]), ("verifier", [1.0, 0.0])):
        adv, _, _ = grpo(np.array(rewards), eps=1e-6)
        expected[p].update({t.traj_id: float(a) for t, a in zip(partial, adv, strict=True)})
    items.append(traj("lonely", 0, 1.0, 0.0))  # 1 of 4, below min_size: dropped at the timeout
    return items, expected


def malformed() -> list[tuple[bytes | None, bytes, str]]:
    """(key, value, a phrase the dead letter's reason must contain)."""
    base = msgpack.unpackb(encode(traj("bad", 0, 1.0, 0.0)), raw=False)
    nan = msgpack.packb({**base, "rewards": {"solver": math.nan, "verifier": 0.0}}, use_bin_type=True)
    stranger = msgpack.packb(
        {**base, "policies": ["solver", "stranger"], "rewards": {"solver": 1.0, "stranger": 0.0}},
        use_bin_type=True,
    )
    wrong_id = msgpack.packb({**base, "group_id": "bad#7"}, use_bin_type=True)
    return [
        (b"junk", b"\xc1 not msgpack at all", "not a msgpack record"),
        (b"bad#0", nan, "rewards.solver: must be finite"),
        (b"bad#0", stranger, "unknown policy 'stranger'"),
        (b"bad#7", wrong_id, "group_id"),
        (b"other#0", encode(traj("bad", 1, 1.0, 0.0)), "Kafka key 'other#0'"),
    ]


def test_worker_end_to_end(streams_harness: MakeHarness) -> None:
    h = streams_harness(POLICIES, PIPELINE, group=GROUP)
    worker = h.start()
    good, expected = good_input()
    bad = malformed()
    inconsistent = traj("partial", 3, 0.0, 0.0)
    inconsistent.group_size = 5  # a pending group, another size: refused by the group stage
    first = [(t.group_id.encode(), t) for t in good[:8]]
    dups = [(t.group_id.encode(), t) for t in (good[0], good[1])]  # their group is already emitted
    rest = [(t.group_id.encode(), t) for t in good[8:]] + [(good[-2].group_id.encode(), good[-2])]
    sent_bad = [(k, v) for k, v, _ in bad] + [(b"partial#0", encode(inconsistent.validate()))]
    h.send(first)
    h.records("samples.solver", expect=8)  # g0 and g1 emitted: the dups below arrive late
    where = h.send(dups + rest + sent_bad)
    bad_where = where[-len(sent_bad) :]

    want = {p: len(v) for p, v in expected.items()}
    samples = {p: h.records(f"samples.{p}", expect=want[p]) for p in POLICIES}
    for policy in POLICIES:
        got = samples[policy]
        ids = Counter(s.traj_id for s in got)
        assert ids == Counter(list(expected[policy])), (
            f"{policy}: {sorted(ids)} != {sorted(expected[policy])}"
        )
        for s in got:
            mask = s.loss_mask.astype(bool)
            assert isinstance(s, Sample) and s.policy == policy and mask.any()
            np.testing.assert_allclose(s.advantages[mask], expected[policy][s.traj_id], rtol=1e-5, atol=1e-6)
            assert not s.advantages[~mask].any()
            assert s.group_samples == Counter(x.group_id for x in got)[s.group_id]
    assert {s.group_samples for s in samples["verifier"] if s.group_id == "g5#0"} == {3}
    assert {s.group_samples for s in samples["solver"] if s.group_id == "trunc#0"} == {3}

    dead = [d for d in h.records("deadletter", expect=len(sent_bad)) if isinstance(d, DeadLetter)]
    assert len(dead) == len(sent_bad)
    by_offset = {(d.partition, d.offset): d for d in dead}
    for (key, value), (part, off), phrase in zip(
        sent_bad, bad_where, [b[2] for b in bad] + ["group_size 5"], strict=True
    ):
        d = by_offset[(part, off)]
        assert d.source_topic == h.kafka.topic("trajectories") and d.raw == value and d.key == key
        assert phrase in d.error and d.component == "streams"

    n_in = len(first) + len(dups) + len(sent_bad) + len(rest)
    values = h.last_metrics(
        "w0",
        until=lambda v: (
            v.get("trajectories.in") == n_in
            and v.get("trajectories.pending") == 0
            and v.get("groups.timeout_dropped") == 1
        ),
    )
    dropped = {k.split(".", 2)[2]: v for k, v in values.items() if k.startswith("trajectories.dropped.")}
    assert dropped == {"zero_variance": 4, "truncated": 1, "timeout": 1, "late": 2, "duplicate": 1}
    assert values["trajectories.deadlettered"] == len(sent_bad)
    assert values["trajectories.out"] == len(expected["solver"])
    assert (
        values["trajectories.in"]
        == values["trajectories.out"]
        + sum(dropped.values())
        + values["trajectories.deadlettered"]
        + values["trajectories.pending"]
    )
    assert (
        values["samples.out.solver"] == want["solver"] and values["samples.out.verifier"] == want["verifier"]
    )
    assert values["groups.timeout_emitted"] == 1 and values["groups.emitted"] == 8
    assert values["stage.grpo.in"] == 6 * 4 + 3 + 2  # the zero-variance group never reaches it

    stats = {r.task_id: r for r in h.records("task-stats", expect=10) if isinstance(r, TaskStats)}
    assert stats["zero"].zero_variance_groups == 1 and stats["zero"].mean_reward == 1.0
    assert stats["g0"].samples == 4 and stats["g0"].mean_reward == pytest.approx(0.5)  # mean over policies
    # groups that reach no trainer say so (the feeder counts them consumed): the zero-variance one
    # and the one dropped at its timeout; every other group reached both trainers
    assert {t for t, r in stats.items() if r.dropped_groups} == {"zero", "lonely"}
    assert (stats["lonely"].groups, stats["lonely"].samples, stats["lonely"].dropped_groups) == (1, 0, 1)

    # the same input again, to a restarted worker: nothing new on the samples topics
    assert h.stop(worker) == 0
    h.start()
    h.send([(t.group_id.encode(), t) for t in good])
    values = h.last_metrics("w1", until=lambda v: v.get("trajectories.in") == len(good))
    assert values["trajectories.dropped.late"] == len(good) and values.get("samples.out.solver", 0) == 0
    for policy in POLICIES:
        again = h.records(f"samples.{policy}", settle=2.0)
        assert len(again) == want[policy], f"{policy}: duplicates after re-sending the input"


def test_a_workers_batches_are_opened_and_a_bad_trajectory_of_one_is_dead_lettered_alone(
    streams_harness: MakeHarness,
) -> None:
    """Workers send a group's trajectories as one TrajectoryBatch: streams takes each on its own. A
    bad trajectory goes to deadletter alone (its own bytes, the batch's position, the item named) and
    its group is emitted without it at the timeout; a batch under another group's key is refused whole."""
    h = streams_harness(POLICIES, PIPELINE, group=GROUP)
    worker = h.start()
    whole = [traj("b0", i, SOLVER[0][i], VERIFIER[0][i]) for i in range(4)]
    holed = [encode(traj("b1", i, SOLVER[1][i], VERIFIER[1][i])) for i in range(4)]
    base = msgpack.unpackb(holed[2], raw=False)
    holed[2] = msgpack.packb({**base, "rewards": {"solver": math.nan, "verifier": 0.0}}, use_bin_type=True)
    stranger = encode(traj("b0", 3, 0.0, 0.0))  # a trajectory of b0 in b2's batch
    mixed = [encode(traj("b2", i, float(i % 2), 1.0)) for i in range(3)] + [stranger]
    misfiled = TrajectoryBatch(group_id="b3#0", items=[encode(traj("b3", i, 1.0, 0.0)) for i in range(4)])
    where = h.send(
        [
            (b"b0#0", TrajectoryBatch(group_id="b0#0", items=[encode(t) for t in whole])),
            (b"b1#0", TrajectoryBatch(group_id="b1#0", items=holed)),
            (b"b2#0", TrajectoryBatch(group_id="b2#0", items=mixed)),
            (b"b9#0", misfiled),
        ]
    )

    solver = h.records("samples.solver", expect=4 + 3 + 3)  # b0 whole; b1 and b2 short one, at the timeout
    assert Counter(s.group_id for s in solver) == {"b0#0": 4, "b1#0": 3, "b2#0": 3}
    adv, _, _ = grpo(np.array(SOLVER[0], float), eps=1e-6)
    for s in solver:
        if s.group_id == "b0#0":
            np.testing.assert_allclose(
                s.advantages[s.loss_mask.astype(bool)],
                adv[int(s.traj_id.rsplit("#")[-1])],
                rtol=1e-5,
                atol=1e-6,
            )
    dead = [d for d in h.records("deadletter", expect=3) if isinstance(d, DeadLetter)]
    assert sorted((d.partition, d.offset) for d in dead) == sorted(where[1:])  # each names its batch
    by_key = {d.key: d for d in dead}
    assert (
        by_key[b"b1#0"].raw == holed[2]
        and "TrajectoryBatch.items[2]" in by_key[b"b1#0"].error
        and "rewards.solver: must be finite" in by_key[b"b1#0"].error
    )
    assert (
        by_key[b"b2#0"].raw == stranger
        and "TrajectoryBatch.items[3]" in by_key[b"b2#0"].error
        and "is not the batch's 'b2#0'" in by_key[b"b2#0"].error
    )
    assert (
        by_key[b"b9#0"].raw == encode(misfiled)
        and "Kafka key 'b9#0' is not the group_id 'b3#0'" in by_key[b"b9#0"].error
    )
    values = h.last_metrics("w0", until=lambda v: v.get("records.in") == 4 and v.get("groups.emitted") == 3)
    assert values["trajectories.in"] == 4 + 4 + 4 + 1  # the refused batch counts as one
    assert values["trajectories.deadlettered"] == 3 and values["trajectories.out"] == 10
    assert h.stop(worker) == 0


@pytest.mark.broker
def test_refuses_to_start_without_its_topics(kafka: KafkaSettings, tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.conftest import subprocess_env
    from tests.streams.conftest import write_recipe

    recipe = write_recipe(
        tmp_path / "recipe.yaml", kafka, POLICIES, PIPELINE, group=GROUP
    )  # no `topics apply`
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "astraflow.cli",
            "streams",
            "-r",
            str(recipe),
            "--data-dir",
            str(tmp_path / "faust"),
        ],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1
    err = " ".join(run.stderr.split())
    assert f"missing topic(s) {kafka.topic('trajectories')}" in err and "astraflow topics apply" in err
