"""The trainer's periodic look for new partitions of its samples topic rides out a broker that
cannot answer (down or restarting: a SIGKILLed broker crashed the trainer there in
tests/faults/test_broker_restart.py), and still raises on a denied topic."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from astraflow.kafka import KafkaReadError
from trainer.intake import SampleIntake


class _Metadata:
    """A consumer whose `list_topics` raises `error`, or answers with `partitions` (and `topic_error`)."""

    def __init__(
        self,
        error: KafkaError | None = None,
        partitions: tuple[int, ...] = (0, 1),
        topic_error: KafkaError | None = None,
    ) -> None:
        self.error, self.partitions, self.topic_error = error, partitions, topic_error
        self.assigned: list[Any] = []

    def list_topics(self, topic: str, timeout: float) -> Any:
        if self.error is not None:
            raise KafkaException(self.error)
        meta = SimpleNamespace(partitions={p: None for p in self.partitions}, error=self.topic_error)
        return SimpleNamespace(topics={topic: meta})

    def incremental_assign(self, parts: list[Any]) -> None:
        self.assigned += parts


def intake(consumer: _Metadata) -> Any:
    return SimpleNamespace(consumer=consumer, topic="ns.samples.p", partitions=[0], partition_check=0.0)


def test_a_broker_that_cannot_answer_is_asked_again_later(caplog: pytest.LogCaptureFixture) -> None:
    me = intake(
        _Metadata(
            KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: Local: Broker transport failure")
        )
    )
    with caplog.at_level(logging.WARNING, logger="trainer.intake"):
        SampleIntake.grow_partitions(me)
    assert me.partitions == [0] and me.partition_check > 0
    assert "no metadata to look for new partitions" in caplog.text and "transport failure" in caplog.text
    me.consumer = _Metadata(topic_error=KafkaError(KafkaError.LEADER_NOT_AVAILABLE))  # back, not ready yet
    SampleIntake.grow_partitions(me)
    assert me.partitions == [0]
    me.consumer = _Metadata(partitions=(0, 1, 2))  # ready, and the topic grew meanwhile
    SampleIntake.grow_partitions(me)
    assert me.partitions == [0, 1, 2] and [tp.partition for tp in me.consumer.assigned] == [1, 2]


@pytest.mark.parametrize("how", ["raised", "in metadata", "fatal"])
def test_a_denied_topic_or_a_fatal_error_raises(how: str) -> None:
    denied = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    consumer = {
        "raised": lambda: _Metadata(denied),
        "in metadata": lambda: _Metadata(topic_error=denied),
        "fatal": lambda: _Metadata(KafkaError(KafkaError._FATAL, "fenced", fatal=True)),
    }[how]()
    with pytest.raises(KafkaReadError, match="ns.samples.p"):
        SampleIntake.grow_partitions(intake(consumer))


def test_reading_a_topics_ends_stops_at_once_on_a_denied_topic_and_waits_out_a_broker_away() -> None:
    """The same metadata rule (astraflow.kafka.partitions_of) for TopicReader.end_offsets: denied
    raises at once, not after its timeout; a transport error is retried until the timeout."""
    import time

    from astraflow.kafka import TopicReader

    denied = SimpleNamespace(consumer=_Metadata(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
    started = time.monotonic()
    with pytest.raises(KafkaReadError, match="TOPIC_AUTHORIZATION_FAILED"):
        TopicReader.end_offsets(denied, "ns.samples.p", timeout=30)  # type: ignore[arg-type]
    assert time.monotonic() - started < 5
    away = SimpleNamespace(consumer=_Metadata(KafkaError(KafkaError._TRANSPORT, "broker transport failure")))
    with pytest.raises(KafkaException):
        TopicReader.end_offsets(away, "ns.samples.p", timeout=1)  # type: ignore[arg-type]
