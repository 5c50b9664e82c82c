"""The validate stage on the two shapes of a `trajectories` record: one Trajectory, or a worker's
TrajectoryBatch of one group, whose trajectories are checked one by one (no Kafka)."""

from __future__ import annotations

import pytest

from astraflow.errors import RecordError
from astraflow.records import Task, Trajectory, TrajectoryBatch, encode
from streams.testing import make_traj
from streams.validate import Validate

POLICIES = frozenset({"policy"})


def test_a_single_trajectory_is_one_item_with_its_own_bytes() -> None:
    traj = make_traj("t0", 1)
    raw = encode(traj)
    [(body, got)] = Validate().split(raw, b"t0#0", POLICIES)
    assert body == raw and got == traj


def test_a_batch_yields_each_trajectory_and_the_reason_of_each_bad_one() -> None:
    good = [encode(make_traj("t0", i)) for i in range(3)]
    other_group = encode(make_traj("t1", 3))
    other_policy = encode(make_traj("t0", 3, policies=("stranger",)))
    batch = TrajectoryBatch(group_id="t0#0", items=[*good, other_group, b"\x00junk", other_policy])
    items = Validate().split(encode(batch), b"t0#0", POLICIES)
    assert [body for body, _ in items] == batch.items  # each with its own bytes, in order
    assert [t.traj_id for _, t in items[:3]] == ["t0#0#0", "t0#0#1", "t0#0#2"]
    errors = [str(e) for _, e in items[3:]]
    assert all(isinstance(e, RecordError) for _, e in items[3:])
    assert (
        errors[0].startswith("TrajectoryBatch.items[3]: ") and "'t1#0' is not the batch's 't0#0'" in errors[0]
    )
    assert errors[1].startswith("TrajectoryBatch.items[4]: ") and "not a msgpack record" in errors[1]
    assert errors[2].startswith("TrajectoryBatch.items[5]: ") and "unknown policy 'stranger'" in errors[2]


@pytest.mark.parametrize(
    ("value", "key", "words"),
    [
        (
            encode(TrajectoryBatch(group_id="t0#0", items=[encode(make_traj("t0", 0))])),
            b"t9#0",
            "TrajectoryBatch.<key>: Kafka key 't9#0' is not the group_id 't0#0'",
        ),
        (
            encode(Task(task_id="t0", env="arithmetic", roles={"solver": "policy"})),
            b"t0#0",
            "t: expected a Trajectory or TrajectoryBatch record, got Task",
        ),
        (
            encode(TrajectoryBatch(group_id="t0#0", items=[encode(make_traj("t0", 0))]))[:-3],
            b"t0#0",
            "not a msgpack record",
        ),
        (None, b"t0#0", "empty record"),
    ],
)
def test_a_bad_record_is_refused_whole(value: bytes | None, key: bytes, words: str) -> None:
    with pytest.raises(RecordError) as err:
        Validate().split(value, key, POLICIES)
    assert words in str(err.value)


def test_an_empty_batch_does_not_decode() -> None:
    with pytest.raises(RecordError, match="items: must not be empty"):
        TrajectoryBatch(group_id="t0#0", items=[])
    with pytest.raises(RecordError, match=r"items\[1\]: expected bytes, got str"):
        TrajectoryBatch(group_id="t0#0", items=[b"x", "y"])  # type: ignore[list-item]
    assert isinstance(Validate()(encode(make_traj()), b"t0#0", POLICIES), Trajectory)
