"""Records through a real broker: the codec with plain confluent-kafka clients, dead letters,
oversized records, at-least-once consumption, and the consumer errors TopicReader raises."""

from __future__ import annotations

import os
import time

import msgpack
import pytest

from astraflow.config import KafkaSettings
from astraflow.deadletters import DeadLetters, decode_or_deadletter
from astraflow.kafka import DeliveryError, KafkaReadError, Publisher, TopicReader, read_to_end
from astraflow.records import DeadLetter, Trajectory, decode, encode
from astraflow.records.fields import MAX_KEY_BYTES
from tests.conftest import MakeTopics
from tests.foundation.strategies import make_traj, seed_records
from tests.kafka_helpers import read_messages

pytestmark = pytest.mark.broker


def read_all(settings: KafkaSettings, topic: str, expect: int, timeout: float = 30.0) -> list:
    return read_messages(settings, topic, until=lambda got: len(got) >= expect, timeout=timeout, settle=1.0)


def test_codec_records_read_back_with_a_plain_consumer(kafka: KafkaSettings, topics: MakeTopics) -> None:
    topics(["solver"])
    records = seed_records()
    pub = Publisher(kafka)
    for r in records:
        pub.send("metrics", r, key=b"k")  # any topic carries bytes; the codec is what is tested
    pub.flush()
    msgs = read_all(kafka, "metrics", len(records))
    assert len(msgs) == len(records)
    assert [decode(m.value()) for m in msgs] == records


def test_wrong_field_type_lands_in_deadletter_with_its_reason(
    kafka: KafkaSettings, topics: MakeTopics
) -> None:
    topics(["solver"])
    pub = Publisher(kafka)
    good = encode(make_traj())
    body = msgpack.unpackb(good, raw=False)
    body["rewards"] = {"solver": "one"}  # a string where a float belongs
    bad = msgpack.packb(body, use_bin_type=True)
    pub.send_raw("trajectories", good, key=b"g1")
    pub.send_raw("trajectories", bad, key=b"g2")
    pub.send_raw("trajectories", b"not msgpack at all", key=b"g3")
    pub.flush()

    dead = DeadLetters(Publisher(kafka), component="test-consumer")
    ok: list[Trajectory] = []
    with TopicReader(kafka, ["trajectories"], group="validators") as reader:
        reader.subscribe()
        deadline = time.monotonic() + 30
        while len(ok) + dead.count < 3 and time.monotonic() < deadline:
            msg = reader.poll(0.5)
            if msg is None:
                continue
            record = decode_or_deadletter(msg, Trajectory, dead)
            if record is not None:
                ok.append(record)
            reader.consumer.store_offsets(message=msg)
        dead.publisher.flush()
    assert ok == [make_traj()]
    letters = [decode(m.value(), DeadLetter) for m in read_all(kafka, "deadletter", 2)]
    assert len(letters) == 2
    by_key = {d.key: d for d in letters}
    wrong = by_key[b"g2"]
    assert wrong.source_topic == kafka.topic("trajectories") and wrong.partition >= 0 and wrong.offset >= 0
    assert wrong.raw == bad and wrong.component == "test-consumer"
    assert "rewards.solver" in wrong.error and "expected a number" in wrong.error
    assert "not a msgpack record" in by_key[b"g3"].error or "expected a msgpack map" in by_key[b"g3"].error


def test_oversized_record_is_a_clear_error(kafka: KafkaSettings, topics: MakeTopics) -> None:
    topics(["solver"])
    pub = Publisher(kafka)
    with pytest.raises(DeliveryError) as info:  # tasks allow 1 MiB; the broker refuses 4 MiB
        pub.send_raw("tasks", os.urandom(4 << 20))  # incompressible: compression cannot save it
        pub.flush(30)
    assert kafka.topic("tasks") in str(info.value)
    assert "too large" in str(info.value).lower()
    with pytest.raises(DeliveryError, match="cannot produce a record of 20971520 bytes"):
        pub.send_raw("trajectories", os.urandom(20 << 20))  # over the client's own limit


def test_a_dead_letter_keeps_what_a_producer_can_send(kafka: KafkaSettings, topics: MakeTopics) -> None:
    """A record that fit its topic only compressed, and a key over MAX_KEY_BYTES, are dead-lettered
    cut (`truncated`). Before, the first raised DeliveryError (a dead letter over the producer's
    message.max.bytes) and the second RecordError (an invalid DeadLetter), and either crashed the
    component that was dead-lettering (tests/faults/test_fuzz.py found both)."""
    topics(["solver"])
    source = kafka.topic("trajectories")
    dead = DeadLetters(Publisher(kafka), component="test-consumer")
    zeros = bytes(kafka.message_max_bytes + (4 << 20))  # compresses to a few kB: the topic takes it
    dead.publish(source, 0, 1, b"huge", zeros, "Trajectory.tokens: too long")
    dead.publish(source, 0, 2, b"k" * (MAX_KEY_BYTES + 10), b"short", "t: unknown record type None")
    dead.publish(source, 0, 3, b"g3", b"short", "bad")
    dead.publisher.flush(60)
    letters = {
        d.offset: d for d in (decode(m.value(), DeadLetter) for m in read_all(kafka, "deadletter", 3, 60))
    }
    assert letters[1].truncated and zeros.startswith(letters[1].raw) and len(letters[1].raw) > (15 << 20)
    assert letters[1].key == b"huge" and letters[1].error == "Trajectory.tokens: too long"
    assert letters[2].truncated and letters[2].key == b"k" * MAX_KEY_BYTES and letters[2].raw == b"short"
    assert not letters[3].truncated and letters[3].key == b"g3" and letters[3].raw == b"short"


def _take(reader: TopicReader, n: int, timeout: float = 30.0) -> list:
    """Join the reader's group and poll until `n` messages came (or `timeout`)."""
    reader.subscribe()
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        msg = reader.poll(0.5)
        if msg is not None:
            got.append(msg)
    return got


def test_offsets_advance_only_past_processed_messages(kafka: KafkaSettings, topics: MakeTopics) -> None:
    topics(["solver"])
    pub = Publisher(kafka)
    for i in range(6):
        pub.send_raw("metrics", f"m{i}".encode(), key=b"same-partition")
    pub.flush()
    with TopicReader(kafka, ["metrics"], group="alo") as first:
        seen = _take(first, 6)
        assert [m.value() for m in seen] == [f"m{i}".encode() for i in range(6)]
        for msg in seen[:3]:  # the last three were "in flight" when this consumer went away
            first.consumer.store_offsets(message=msg)
        first.consumer.commit(asynchronous=False)
    with TopicReader(kafka, ["metrics"], group="alo") as second:
        again = [m.value() for m in _take(second, 3)]
    assert again == [b"m3", b"m4", b"m5"]


def test_a_reader_of_an_unknown_topic_raises_naming_it(kafka: KafkaSettings, topics: MakeTopics) -> None:
    """Subscribed or assigned, a topic that does not exist stops the reader with a clear error
    (the loops this replaced dropped every consumer error and spun on)."""
    topics(["solver"])
    missing = rf"{kafka.topic('no-such-topic')} does not exist"
    with TopicReader(kafka, ["no-such-topic"], group="lost") as reader:
        reader.missing_s = 1.0  # it may be a fresh topic for this long
        reader.subscribe()
        with pytest.raises(KafkaReadError, match=missing):
            for _ in range(200):
                reader.poll(0.2)
        with pytest.raises(KafkaReadError, match=missing):
            reader.end_offsets(kafka.topic("no-such-topic"), timeout=1.0)  # the assigning readers' check


def test_read_to_end_reads_every_partition_from_the_beginning(
    kafka: KafkaSettings, topics: MakeTopics
) -> None:
    topics(["solver"])
    records = seed_records()
    pub = Publisher(kafka)
    for i, r in enumerate(records):
        pub.send("metrics", r, key=f"k{i}")  # keys spread them over the partitions
    pub.send_raw("metrics", b"not a record")  # skipped: reports read what they can
    pub.flush()
    got = read_to_end(kafka, "metrics")
    assert sorted(map(repr, (r for _, r in got))) == sorted(map(repr, records))
    assert all(ts > 0 for ts, _ in got)


def test_read_to_end_passes_offsets_that_hold_no_message(kafka: KafkaSettings, topics: MakeTopics) -> None:
    """A partition whose last offset is a transaction's commit marker (no message shows it) is read
    to its end by the consumer's position: waiting for a message at offset end-1 timed out."""
    from confluent_kafka import Producer

    from astraflow.kafka import producer_config

    topics(["solver"])
    producer = Producer(
        {
            **producer_config(kafka),
            "transactional.id": f"t-{kafka.namespace}",
            "transaction.timeout.ms": 300_000,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    record = seed_records()[0]
    producer.produce(kafka.topic("metrics"), encode(record), key=b"k", partition=0)
    producer.commit_transaction(30)
    # The coordinator writes the commit marker once the commit is prepared, after
    # commit_transaction has returned: until then a read_committed reader's end (the last stable
    # offset) is still 0 (CI: `assert 0 == 2` once, on a loaded machine).
    deadline = time.monotonic() + 30
    while True:
        reader = TopicReader(kafka, ["metrics"], from_beginning=True)
        if reader.ends[(kafka.topic("metrics"), 0)] == 2 or time.monotonic() > deadline:
            break
        reader.close()
        time.sleep(0.1)
    with reader:
        assert reader.ends[(kafka.topic("metrics"), 0)] == 2  # the record and the marker
        started = time.monotonic()
        got = [decode(m.value()) for m in reader.to_end(timeout=20)]
    assert got == [record] and time.monotonic() - started < 15


def test_wait_for_topics_returns_when_they_are_created(kafka: KafkaSettings) -> None:
    """A component started while its run creates the topics: it waits for them, then goes on."""
    import threading

    from astraflow import topics as topic_spec
    from astraflow.kafka import make_admin, wait_for_topics

    specs = topic_spec.expand(topic_spec.load_spec(), ["policy"], kafka)
    later = threading.Timer(1.5, lambda: topic_spec.apply(make_admin(kafka), specs))
    later.start()
    started = time.monotonic()
    try:
        wait_for_topics(kafka, ["tasks", "samples.policy"], timeout_s=60)
    finally:
        later.join()
    assert time.monotonic() - started >= 1.0  # it did wait for them


def test_wait_for_topics_names_the_missing_ones_after_its_timeout(
    kafka: KafkaSettings, topics: MakeTopics
) -> None:
    from astraflow.errors import ConfigError
    from astraflow.kafka import wait_for_topics

    topics()
    with pytest.raises(
        ConfigError, match=rf"missing topic\(s\) {kafka.topic('nope')} after 1s.*topics apply"
    ):
        wait_for_topics(kafka, ["tasks", "nope"], timeout_s=1.0)


def test_wait_for_topics_does_not_wait_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Started alone (no ASTRAFLOW_TOPICS_WAIT_S), a component gets its missing-topic error at once."""
    from astraflow.errors import ConfigError
    from astraflow.kafka import TOPICS_WAIT_ENV, wait_for_topics

    monkeypatch.delenv(TOPICS_WAIT_ENV, raising=False)
    nowhere = KafkaSettings(bootstrap="127.0.0.1:9", namespace="x")  # nothing listens on port 9
    started = time.monotonic()
    wait_for_topics(nowhere, ["tasks"])
    assert time.monotonic() - started < 0.5

    monkeypatch.setenv(TOPICS_WAIT_ENV, "0.5")  # asked: it waits, then names what it waited for
    with pytest.raises(ConfigError, match=r"127\.0\.0\.1:9: no answer; missing topic\(s\) x\.tasks"):
        wait_for_topics(nowhere, ["tasks"])
    asks = []  # a component asked to stop while it waits (its run's broker did not start) stops waiting
    wait_for_topics(nowhere, ["tasks"], timeout_s=600, stopped=lambda: asks.append(1) or len(asks) > 2)
    assert len(asks) == 3
