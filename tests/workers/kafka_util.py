"""Reading topics back in the workers' broker tests."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from astraflow.config import KafkaSettings
from astraflow.kafka import client_config
from astraflow.records import decode


def read_topic(settings: KafkaSettings, topic: str, until: Callable[[list[Any]], bool] | None = None,
               timeout: float = 30.0) -> list[Any]:
    """Decode every record of `topic` from the beginning; with `until`, keep reading (up to
    `timeout`) until it holds, else stop once the topic is drained."""
    from confluent_kafka import Consumer, TopicPartition

    conf = client_config(settings)
    conf.update({"group.id": f"reader-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                 "auto.offset.reset": "earliest"})
    consumer = Consumer(conf)
    name = settings.topic(topic)
    md = consumer.list_topics(name, timeout=15)
    consumer.assign([TopicPartition(name, p, 0) for p in md.topics[name].partitions])
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    idle = 0
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                idle += 1
                if until is None and idle >= 4:
                    break
                if until is not None and until(out):
                    break
                continue
            idle = 0
            out.append(decode(msg.value()))
            if until is not None and until(out):
                break
    finally:
        consumer.close()
    return out


def committed(settings: KafkaSettings, group: str, topic: str) -> dict[int, int]:
    """Committed offsets of a consumer group, and the topic's end offsets, per partition."""
    from confluent_kafka import Consumer, TopicPartition

    conf = client_config(settings)
    conf.update({"group.id": settings.group(group), "enable.auto.commit": False})
    consumer = Consumer(conf)
    name = settings.topic(topic)
    md = consumer.list_topics(name, timeout=15)
    parts = [TopicPartition(name, p) for p in md.topics[name].partitions]
    out = {tp.partition: tp.offset for tp in consumer.committed(parts, timeout=15)}
    consumer.close()
    return out


def end_offsets(settings: KafkaSettings, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    conf = client_config(settings)
    conf.update({"group.id": f"reader-{uuid.uuid4().hex[:8]}"})
    consumer = Consumer(conf)
    name = settings.topic(topic)
    md = consumer.list_topics(name, timeout=15)
    out = {p: consumer.get_watermark_offsets(TopicPartition(name, p), timeout=15)[1] for p in md.topics[name].partitions}
    consumer.close()
    return out
