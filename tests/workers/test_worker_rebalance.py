"""The workers' task consumer across rebalances, against the real broker: a partition taken from a
worker while it was paused and given back while it takes tasks again is consumed (librdkafka keeps a
partition's pause flag across a revoke and a re-assign; the worker's assignment callback resets it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from astraflow.config import KafkaSettings
from astraflow.kafka import make_admin, make_consumer, make_producer
from workers.startup import task_consumer_overrides
from workers.worker import take_partitions

pytestmark = pytest.mark.broker

PARTITIONS = 4


def poll_until(consumers: list[Any], done: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll every consumer (the topic is empty: rebalances only) until `done()`."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the group did not settle"
        for c in consumers:
            c.poll(0.1)


def test_a_partition_given_back_after_a_pause_is_consumed(kafka: KafkaSettings) -> None:
    from confluent_kafka.admin import NewTopic

    topic = kafka.topic("rebalance")
    admin = make_admin(kafka)  # held: the future fails if its client is collected first
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    group = kafka.group("workers")
    paused = [False]  # the worker's state: are its partitions paused (its queue of episodes full)?

    def on_assign(consumer: Any, partitions: list[Any]) -> None:
        take_partitions(consumer, partitions, paused[0])

    def owned(c: Any) -> set[int]:
        return {tp.partition for tp in c.assignment()}

    a = make_consumer(kafka, group, **task_consumer_overrides("a"))
    b = make_consumer(kafka, group, **task_consumer_overrides("b"))
    try:
        a.subscribe([topic], on_assign=on_assign)
        poll_until([a], lambda: len(owned(a)) == PARTITIONS)
        # the worker's queue fills: it pauses everything it owns; a second worker joins and takes half
        paused[0] = True
        a.pause(a.assignment())
        b.subscribe([topic])
        poll_until([a, b], lambda: bool(owned(b)) and len(owned(a) | owned(b)) == PARTITIONS)
        moved = owned(b)
        # the queue drains and the worker resumes what it owns; the second worker leaves
        paused[0] = False
        a.resume(a.assignment())
        b.close()
        b = None
        poll_until([a], lambda: len(owned(a)) == PARTITIONS)
        producer = make_producer(kafka)
        for p in range(PARTITIONS):
            producer.produce(topic, b"task", partition=p)
        assert producer.flush(30) == 0
        seen: set[int] = set()
        deadline = time.monotonic() + 30
        while seen != set(range(PARTITIONS)) and time.monotonic() < deadline:
            msg = a.poll(0.2)
            if msg is not None and msg.error() is None:
                seen.add(msg.partition())
        assert seen == set(range(PARTITIONS)), (
            f"partitions {sorted(moved)} went to the second worker while the first was paused and came "
            f"back; the first consumed only {sorted(seen)}"
        )
    finally:
        a.close()
        if b is not None:
            b.close()
