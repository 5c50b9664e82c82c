"""The trainer's intake opens the SampleBatch records streams writes: every Sample counts at the
batch's offset, a bad item is dead-lettered alone (its own bytes, the batch's position, the item
named), and restart offsets hold the batch until its group trained."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import msgpack

from astraflow.records import Sample, SampleBatch, encode, sample_batches
from tests.trainer.synth import make_group
from trainer.batching import GroupBuffer
from trainer.intake import SampleIntake


class Msg:
    def __init__(self, value: bytes, offset: int, key: bytes = b"k") -> None:
        self._value, self._offset, self._key = value, offset, key

    def value(self) -> bytes:
        return self._value

    def key(self) -> bytes:
        return self._key

    def topic(self) -> str:
        return "samples.solver"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


class Dead:
    def __init__(self) -> None:
        self.letters: list[tuple[Any, ...]] = []
        self.count = 0

    def publish(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        raw: bytes,
        error: str,
        on_delivery: Any = None,
    ) -> None:
        self.letters.append((topic, partition, offset, raw, error))

    def publish_message(self, msg: Any, error: str, on_delivery: Any = None) -> None:
        self.publish(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(), error)


def intake() -> tuple[SampleIntake, Dead]:
    taker = SampleIntake.__new__(SampleIntake)  # no Kafka: only the message path is under test
    dead = Dead()
    taker.buffer, taker.dead, taker.policies = GroupBuffer("solver"), dead, frozenset({"solver", "verifier"})
    return taker, dead


def test_a_batch_of_a_group_fills_it_at_the_batchs_offset() -> None:
    taker, dead = intake()
    group = make_group("solver", "t1", size=4)
    (batch,) = sample_batches(group, 1 << 20)
    taker._intake(Msg(encode(batch), offset=7))
    assert not dead.letters and taker.buffer.counts["groups.complete"] == 1
    assert taker.buffer.offsets() == {0: 7}  # held until the group trained
    got = taker.buffer.take(1, None, version=0, max_staleness=2)
    assert got is not None and sorted(s.traj_id for s in got.samples) == sorted(s.traj_id for s in group)
    taker.buffer.done(got, step=1)
    assert taker.buffer.offsets() == {0: 8}
    taker._intake(Msg(encode(batch), offset=8))  # re-read after a restart: all duplicates
    assert taker.buffer.counts["samples.duplicate"] == 4 and not taker.buffer.ready


def test_a_bad_item_is_dead_lettered_alone_and_the_rest_of_the_batch_kept() -> None:
    taker, dead = intake()
    group = make_group("solver", "t2", size=4)
    items = [encode(s) for s in group]
    items[1] = msgpack.packb(
        {**msgpack.unpackb(items[1], raw=False), "reward": float("nan")}, use_bin_type=True
    )
    items[2] = encode(replace(group[2], group_id="other#0"))  # not the batch's group
    items.append(encode(replace(group[3], policy="verifier", traj_id="t2#0#9")))  # not the batch's policy
    batch = SampleBatch(group_id=group[0].group_id, policy="solver", items=items)
    taker._intake(Msg(encode(batch), offset=3))
    assert [(off, raw) for _, _, off, raw, _ in dead.letters] == [(3, items[1]), (3, items[2]), (3, items[4])]
    errors = [e for *_, e in dead.letters]
    assert errors[0].startswith("SampleBatch.items[1]: Sample.reward") and "finite" in errors[0]
    assert errors[1] == "SampleBatch.items[2]: Sample.group_id: 'other#0' is not the batch's 't2#0'"
    assert errors[2] == "SampleBatch.items[4]: Sample.policy: 'verifier' is not the batch's 'solver'"
    assert taker.buffer.counts["samples.in"] == 2 and not taker.buffer.ready  # 2 of 4: the group waits


def test_single_sample_records_are_still_read() -> None:
    taker, dead = intake()
    for i, s in enumerate(make_group("solver", "t3", size=2)):
        taker._intake(Msg(encode(s), offset=i))
    assert not dead.letters and taker.buffer.counts["groups.complete"] == 1
    assert isinstance(make_group("solver", "t3", size=2)[0], Sample)
