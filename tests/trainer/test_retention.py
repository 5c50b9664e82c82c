"""A trainer resumed at offsets that retention deleted says so: a warning naming the partitions
and the gap, and the count in `samples.lost_to_retention`."""

from __future__ import annotations

import logging
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from astraflow.config import KafkaSettings
from trainer import retention
from trainer.intake import SampleIntake


def test_gaps_are_where_the_low_watermark_passed_the_checkpoint() -> None:
    saved = {0: 100, 1: 50, 2: 7}
    lows = {0: 100, 1: 80, 2: 0, 3: 500}  # 3: never read before, starts at the beginning
    assert retention.gaps(saved, lows) == {1: (50, 80)}
    assert retention.gaps({}, lows) == {}
    assert retention.describe("ns.samples.solver", {1: (50, 80), 4: (0, 2)}) == (
        "ns.samples.solver: 32 samples past the checkpoint were deleted by retention before this trainer "
        "read them (partition 1: offsets 50..79, partition 4: offsets 0..1); "
        "it resumes at the earliest offsets left"
    )


class _Watermarks:
    """A consumer whose topic has the partitions of `lows`, each with that low watermark (high 10 above)."""

    def __init__(self, lows: dict[int, int]) -> None:
        self.lows = lows

    def list_topics(self, topic: str, timeout: float) -> Any:
        meta = SimpleNamespace(partitions=dict.fromkeys(self.lows), error=None)
        return SimpleNamespace(topics={topic: meta})

    def offsets_for_times(self, tps: list[Any], timeout: float) -> list[Any]:
        from confluent_kafka import OFFSET_BEGINNING

        return [
            SimpleNamespace(
                partition=tp.partition,
                offset=self.lows[tp.partition] + (0 if tp.offset == OFFSET_BEGINNING else 10),
                error=None,
            )
            for tp in tps
        ]


def test_the_trainer_warns_and_counts_at_setup(caplog: pytest.LogCaptureFixture) -> None:
    me = SimpleNamespace(
        consumer=_Watermarks({0: 10, 1: 3}),
        topic="samples.p",
        partitions=[0, 1],
        buffer=SimpleNamespace(counts=Counter({"samples.lost_to_retention": 5})),
    )
    with caplog.at_level(logging.WARNING, logger="trainer.intake"):
        SampleIntake.check_retention(me, {0: 4, 1: 3})  # type: ignore[arg-type]
    assert me.buffer.counts["samples.lost_to_retention"] == 11  # a running total across restarts
    assert "partition 0: offsets 4..9" in caplog.text and "6 samples" in caplog.text
    caplog.clear()
    SampleIntake.check_retention(me, {0: 10, 1: 3})  # type: ignore[arg-type]
    assert me.buffer.counts["samples.lost_to_retention"] == 11 and not caplog.text


@pytest.mark.broker
def test_low_watermarks_after_records_were_deleted(kafka: KafkaSettings, topics: Any) -> None:
    from confluent_kafka import Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    from astraflow.kafka import client_config, make_consumer, producer_config, watermarks

    topics(["policy"])
    name = kafka.topic("samples.policy")
    producer = Producer(producer_config(kafka))
    for i in range(10):
        producer.produce(name, key=b"k", value=str(i).encode(), partition=0)
    producer.flush(30)
    admin = AdminClient(client_config(kafka))
    for fut in admin.delete_records([TopicPartition(name, 0, 6)]).values():
        fut.result(30)
    consumer = make_consumer(kafka, "retention-probe", **{"enable.auto.commit": False})
    try:
        parts = sorted(consumer.list_topics(name, timeout=15).topics[name].partitions)
        lows = {p: low for p, (low, _) in watermarks(consumer, name).items()}
    finally:
        consumer.close()
    assert lows[0] == 6 and all(lows[p] == 0 for p in parts if p != 0)
    assert retention.gaps({0: 2, **{p: 0 for p in parts if p != 0}}, lows) == {0: (2, 6)}
