"""Reading and writing Kafka, shared by every component, and the one import path of its helpers.

- `Publisher`: encode-validate-produce of wire records, with delivery errors surfaced, not lost.
- `TopicReader`: the one consumer of every component, its errors handled here (fatal ones raise
  with topic, partition and offset); `read_to_end` reads a topic from the beginning in one call.
- `partitions_of`: a topic's partitions as the cluster tells them, `watermarks` with their offsets;
  `partition_for`: the partition a key hashes to (murmur2, as Kafka's Java client and aiokafka);
  `wait_for_topics`: a component started with its run waits for the run's topics.
- `make_consumer`: every consumer of the code base is made here (the one Kafka boundary).
- Re-exported from astraflow/kafka_clients.py: the clients' configuration (`client_config`,
  `producer_config` for idempotent producers, `consumer_config`, `fetch_limit`, `resolve`) and
  the functions that make the other clients (`make_admin`, `make_producer`).
- `faust_settings` (astraflow/kafka_faust.py): the same connection settings for Faust/aiokafka.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from astraflow.config.kafka import KafkaSettings
from astraflow.errors import AstraFlowError, ConfigError, RecordError
from astraflow.kafka_clients import (
    WARM_TIMEOUT_S,
    accepting,
    client_config,
    consumer_config,
    fetch_limit,
    make_admin,
    make_producer,
    producer_config,
    resolve,
)
from astraflow.records import Record, decode, encode

__all__ = [  # with those of astraflow/kafka_clients.py, re-exported: this is their one import path
    "DENIED",
    "TOPICS_WAIT_ENV",
    "UNKNOWN",
    "WARM_TIMEOUT_S",
    "DeliveryError",
    "KafkaReadError",
    "Publisher",
    "TopicReader",
    "client_config",
    "consumer_config",
    "fetch_limit",
    "make_admin",
    "make_consumer",
    "make_producer",
    "partitions_of",
    "producer_config",
    "read_to_end",
    "resolve",
    "wait_for_topics",
    "watermarks",
]

TOPICS_WAIT_ENV = "ASTRAFLOW_TOPICS_WAIT_S"  # wait_for_topics: how long a component waits for its topics

log = logging.getLogger(__name__)


class DeliveryError(AstraFlowError):
    """The broker did not acknowledge a record."""


class Publisher:
    """Encodes wire records and produces them idempotently; delivery failures are collected and
    raised by `flush()` (and passed to per-record callbacks), never dropped."""

    def __init__(self, settings: KafkaSettings, **overrides: Any) -> None:
        self.settings = settings
        self.producer = make_producer(settings, **overrides)
        self._errors: list[str] = []
        self.lost_lossy = 0  # records sent with lossy=True that were not delivered
        self._lock = threading.Lock()
        #: (full topic, partition) -> offset just past the last record the broker acknowledged
        self.acked_ends: dict[tuple[str, int], int] = {}

    def send(
        self,
        topic: str,
        record: Record,
        key: str | bytes | None = None,
        on_delivery: Callable[[Exception | None], None] | None = None,
        known_policies: frozenset[str] | None = None,
        lossy: bool = False,
        partition: int = -1,
    ) -> int:
        """Produce `record` to the base topic `topic` (namespace applied), to `partition` (-1: by the
        key). Returns its size in bytes. A `lossy` record (metrics) that is not delivered is only
        counted in `lost_lossy`, never raised by `flush()`: metrics that timed out while the broker
        restarted made every component crash (or fail to stop) after the broker was back."""
        return self.send_raw(topic, encode(record, known_policies), key, on_delivery, lossy, partition)

    def send_raw(
        self,
        topic: str,
        value: bytes,
        key: str | bytes | None = None,
        on_delivery: Callable[[Exception | None], None] | None = None,
        lossy: bool = False,
        partition: int = -1,
    ) -> int:
        from confluent_kafka import KafkaException

        full = self.settings.topic(topic)

        def _done(err: Any, msg: Any) -> None:
            exc = DeliveryError(f"{full}: {err}") if err is not None else None
            if exc is not None:
                with self._lock:
                    if lossy:
                        self.lost_lossy += 1
                    else:
                        self._errors.append(str(exc))
            else:
                key_ = (full, msg.partition())
                self.acked_ends[key_] = max(self.acked_ends.get(key_, 0), msg.offset() + 1)
            if on_delivery is not None:
                on_delivery(exc)

        while True:
            try:
                self.producer.produce(full, value=value, key=key, partition=partition, on_delivery=_done)
                break
            except BufferError:
                self.producer.poll(0.1)  # local queue full: serve callbacks, then retry
            except KafkaException as exc:
                raise DeliveryError(f"{full}: cannot produce a record of {len(value)} bytes: {exc}") from None
        self.producer.poll(0)
        return len(value)

    def poll(self, timeout: float = 0.0) -> None:
        self.producer.poll(timeout)

    def flush(self, timeout: float = 60.0) -> None:
        """Wait for every record to be acknowledged; raise DeliveryError for any that was not."""
        remaining = self.producer.flush(timeout)
        with self._lock:
            errors, self._errors = self._errors, []
        if remaining:
            errors.append(f"{remaining} record(s) still unacknowledged after {timeout}s")
        if errors:
            raise DeliveryError(
                "; ".join(errors[:5]) + (f" (+{len(errors) - 5} more)" if len(errors) > 5 else "")
            )


class KafkaReadError(AstraFlowError):
    """A consumer error that reading cannot get past: authorisation denied, an unknown topic."""


#: librdkafka errors (KafkaError.name()) that retrying cannot cure: reading raises KafkaReadError
DENIED = frozenset(
    {
        "TOPIC_AUTHORIZATION_FAILED",
        "GROUP_AUTHORIZATION_FAILED",
        "CLUSTER_AUTHORIZATION_FAILED",
        "SASL_AUTHENTICATION_FAILED",
        "_AUTHENTICATION",
    }
)
UNKNOWN = frozenset({"UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC", "_UNKNOWN_PARTITION"})


@functools.lru_cache(maxsize=4096)
def partition_for(key: str, partitions: int) -> int:
    """The partition of `key` among `partitions` as Kafka's Java client, aiokafka and so Faust choose
    it (murmur2; librdkafka's default differs, so a confluent-kafka producer that must agree with
    them passes this partition explicitly). Cached: aiokafka's murmur2 is Python, ~6 us a key."""
    from aiokafka.partitioner import DefaultPartitioner

    parts = list(range(partitions))
    return DefaultPartitioner()(key.encode("utf-8"), parts, parts)


def partitions_of(client: Any, topic: str, timeout: float = 15.0) -> list[int]:
    """The partitions of the full topic name `topic` (asked through any client); empty while the
    cluster cannot say (no topic or no leader yet). Denied access or a fatal client error raises
    KafkaReadError; a broker that cannot answer now raises KafkaException, to try again."""
    from confluent_kafka import KafkaException

    try:
        meta = client.list_topics(topic, timeout=timeout).topics.get(topic)
    except KafkaException as exc:
        err: Any = exc.args[0] if exc.args else None
        if hasattr(err, "fatal") and (err.fatal() or err.name() in DENIED):
            raise KafkaReadError(f"{topic}: {err.str()} ({err.name()})") from None
        raise
    if meta is not None and meta.error is not None and meta.error.name() in DENIED:
        raise KafkaReadError(f"{topic}: {meta.error.str()} ({meta.error.name()})")
    if meta is None or meta.error is not None:
        return []
    return sorted(meta.partitions)


def watermarks(consumer: Any, topic: str, timeout: float = 5.0) -> dict[int, tuple[int, int]]:
    """{partition: (low, high)} of `topic`; empty while it has none (errors as `partitions_of`).
    One ListOffsets request an end for all partitions (`get_watermark_offsets` sent two a partition:
    16 a look of the lag and routing probes); high is the consumer's end (read_committed: the LSO)."""
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaException, TopicPartition

    def offsets_at(at: int) -> dict[int, int]:
        found = consumer.offsets_for_times([TopicPartition(topic, p, at) for p in parts], timeout=timeout)
        if errors := [tp.error for tp in found if tp.error is not None]:
            raise KafkaException(errors[0])
        return {tp.partition: tp.offset for tp in found}

    parts = partitions_of(consumer, topic, timeout=timeout)
    if not parts:
        return {}
    lows, highs = offsets_at(OFFSET_BEGINNING), offsets_at(OFFSET_END)
    return {p: (lows[p], highs[p]) for p in parts}


def wait_for_topics(
    settings: KafkaSettings,
    bases: list[str],
    timeout_s: float | None = None,
    interval_s: float = 0.1,
    stopped: Callable[[], bool] = lambda: False,
) -> None:
    """Return once the broker answers and has every topic of `bases`, for up to `timeout_s` (default:
    $ASTRAFLOW_TOPICS_WAIT_S, else no wait); then a ConfigError naming the missing ones. `astraflow
    run` sets the variable for its components and starts them while its broker boots: they import
    torch and load their models meanwhile and connect once the run has created the topics. Started
    alone, a component does not wait: a missing topic is its clear error at once, as before. Returns
    early once `stopped()` (a component asked to stop, e.g. because its run's broker failed to start)."""
    from confluent_kafka import KafkaException

    if timeout_s is None:
        timeout_s = float(os.environ.get(TOPICS_WAIT_ENV) or 0)
    if timeout_s <= 0:
        return
    bootstrap = settings.require_bootstrap()
    names = [settings.topic(b) for b in bases]
    deadline = time.monotonic() + timeout_s
    next_note = time.monotonic() + 10.0
    admin = None
    missing = names
    while not stopped():
        if admin is None and accepting(bootstrap):
            admin = make_admin(settings)
        if admin is not None:
            try:
                missing = [n for n in names if not partitions_of(admin, n, timeout=5.0)]
            except KafkaException:  # up, but not answering yet
                missing = names
            if not missing:
                return
        now = time.monotonic()
        if now >= deadline:
            where = "its topics" if admin is not None else "no answer"
            raise ConfigError(
                f"Kafka at {bootstrap}: {where}; missing topic(s) {', '.join(missing)} after "
                f"{timeout_s:.0f}s. The broker does not create topics on use: create them with "
                f"`astraflow topics apply --recipe <recipe>` (namespace {settings.namespace!r})"
            )
        if now >= next_note:
            log.info("waiting for Kafka at %s and topic(s) %s", bootstrap, ", ".join(missing))
            next_note = now + 10.0
        time.sleep(interval_s)


def make_consumer(settings: KafkaSettings, group: str | None = None, **overrides: Any) -> Any:
    """A confluent Consumer with `consumer_config`; without `group`, a throw-away group that never
    commits (for readers that assign partitions themselves)."""
    from confluent_kafka import Consumer

    if group is None:
        group = f"reader-{uuid.uuid4().hex[:8]}"
        overrides = {"enable.auto.commit": False, **overrides}
    return Consumer(consumer_config(settings, group, **overrides))


class TopicReader:
    """The one consumer of every component: a confluent Consumer whose errors are handled here.

    `TopicReader(settings, ["weights"], from_beginning=True)`: every partition of the base topics
    from the beginning, with a throw-away group (`ends`: their end offsets then). With `group=`,
    `subscribe()` joins that group. `poll`, `consume` and `poll_batch` return only messages without
    error: a fatal one (DENIED, UNKNOWN) raises KafkaReadError with topic, partition and offset,
    another (a broker away for a moment) is logged. `consumer` is the client, for the rest.
    """

    missing_s = 30.0  # how long a subscribed topic may be unknown before that is fatal (a fresh one lags)

    def __init__(
        self,
        settings: KafkaSettings,
        topics: list[str] | tuple[str, ...] = (),
        *,
        group: str | None = None,
        from_beginning: bool = False,
        **overrides: Any,
    ) -> None:
        self.settings = settings
        self.topics = [settings.topic(t) for t in topics]
        self.consumer = make_consumer(settings, group, **overrides)
        self.ends: dict[tuple[str, int], int] = {}
        if from_beginning:
            self.assign_from_beginning(self.topics)

    def end_offsets(self, topic: str, timeout: float = 30.0) -> dict[int, int]:
        """End offset of every partition of the full topic name `topic`, retrying while a fresh
        topic has no leader yet; a denied or (after `timeout`) missing topic raises KafkaReadError."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + timeout
        while True:
            try:
                if marks := watermarks(self.consumer, topic, timeout=15):
                    return {p: high for p, (_, high) in marks.items()}
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise KafkaReadError(f"topic {topic} does not exist (run `astraflow topics apply`)")
            time.sleep(0.5)

    def assign_from_beginning(self, topics: list[str]) -> None:
        """Assign every partition of the full topic names from offset 0; `ends` learns their ends."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        parts = []
        for topic in topics:
            for p, high in self.end_offsets(topic).items():
                self.ends[(topic, p)] = high
                parts.append(TopicPartition(topic, p, OFFSET_BEGINNING))
        self.consumer.assign(parts)

    def subscribe(self, **callbacks: Any) -> None:
        self.consumer.subscribe(self.topics, **callbacks)

    def check(self, msg: Any) -> bool:
        """True for a message to process; a fatal error raises, another one is logged."""
        err = msg.error()
        if err is None:
            return True
        where = f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"
        if err.name() in UNKNOWN and msg.topic():
            self.end_offsets(msg.topic(), self.missing_s)
        elif err.fatal() or err.name() in DENIED:
            raise KafkaReadError(f"consumer of {where}: {err.str()} ({err.name()})")
        if err.name() != "_PARTITION_EOF":
            log.warning("consumer of %s: %s", where, err.str())
        return False

    def poll(self, timeout: float) -> Any | None:
        msg = self.consumer.poll(timeout)
        return msg if msg is not None and self.check(msg) else None

    def consume(self, num: int, timeout: float) -> list[Any]:
        """Up to `num` messages, waiting the whole `timeout` unless `num` arrive (see poll_batch)."""
        return [m for m in self.consumer.consume(num, timeout) if self.check(m)]

    def poll_batch(self, timeout: float, num: int = 1000) -> list[Any]:
        """Wait up to `timeout` for the first message, then take up to `num` more that are ready."""
        first = self.consumer.poll(timeout)
        if first is None:
            return []
        return [m for m in [first, *self.consumer.consume(num, 0)] if self.check(m)]

    def to_end(
        self, timeout: float = 60.0, poll_s: float = 0.5, ends: dict[tuple[str, int], int] | None = None
    ) -> Iterator[Any]:
        """The messages up to `ends` ((topic, partition) -> end offset; by default those that
        `assign_from_beginning` found); raises AstraFlowError naming the partitions not read to
        their end in time. Done is judged by the consumer's position, not by the messages seen:
        a partition already read to its end, or whose last offsets hold no message (transaction
        markers, compacted records), yields nothing more, and waiting for a message would time out."""
        from confluent_kafka import TopicPartition

        todo = {tp: high for tp, high in (self.ends if ends is None else ends).items() if high > 0}
        deadline = time.monotonic() + timeout
        while todo:
            for tp in self.consumer.position([TopicPartition(t, p) for t, p in todo]):
                if tp.offset >= todo[(tp.topic, tp.partition)]:  # -1001: nothing read yet
                    del todo[(tp.topic, tp.partition)]
            if not todo:
                return
            if time.monotonic() > deadline:
                raise AstraFlowError(f"could not read {sorted(todo)} to its end within {timeout:.0f}s")
            yield from self.poll_batch(poll_s)

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_to_end(settings: KafkaSettings, topic: str, timeout: float = 60.0) -> list[tuple[float, Any]]:
    """(broker time in s, decoded record) of the base topic `topic`, from the beginning to its end when
    called, by a throw-away group; undecodable records are skipped (for reports and benches)."""
    out: list[tuple[float, Any]] = []
    with TopicReader(settings, [topic], from_beginning=True) as reader:
        for msg in reader.to_end(timeout):
            with contextlib.suppress(RecordError):
                out.append((msg.timestamp()[1] / 1000.0, decode(msg.value() or b"")))
    return out
