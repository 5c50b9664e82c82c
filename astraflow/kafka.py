"""Kafka client helpers shared by every component.

- `producer_config` / `make_producer`: idempotent producers (acks=all, enable.idempotence).
- `AtLeastOnceConsumer`: offsets are stored only after the caller says a message is processed,
  so a crash re-delivers instead of losing; downstream dedupe by deterministic ids does the rest.
- `Publisher`: encode-validate-produce of wire records, with delivery errors surfaced, not lost.
- `DeadLetters` and `decode_or_deadletter`: the one place where a bad record is caught, with its
  source topic, partition, offset and reason.
- `faust_settings`: the same connection settings for Faust/aiokafka, SASL_SSL included.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from astraflow.config.kafka import KafkaSettings
from astraflow.errors import AstraFlowError, RecordError
from astraflow.records import DeadLetter, Record, decode, encode

log = logging.getLogger(__name__)
R = TypeVar("R", bound=Record)


def resolve(settings: KafkaSettings | None = None) -> KafkaSettings:
    """Settings with ASTRAFLOW_* applied and, if no bootstrap is set, the local broker's address."""
    settings = KafkaSettings.from_env(settings)
    if not settings.bootstrap:
        from astraflow.broker import local_bootstrap

        found = local_bootstrap()
        if found:
            settings = settings.model_copy(update={"bootstrap": found})
    settings.require_bootstrap()
    return settings


def client_config(settings: KafkaSettings) -> dict[str, Any]:
    """librdkafka settings common to producers, consumers and admin clients."""
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.require_bootstrap(),
        "client.id": f"{settings.client_id}@{socket.gethostname()}",
        "security.protocol": settings.security_protocol,
    }
    if settings.security_protocol.startswith("SASL"):
        conf["sasl.mechanisms"] = settings.sasl_mechanism
        if settings.sasl_username is not None:
            conf["sasl.username"] = settings.sasl_username
        if settings.sasl_password is not None:
            conf["sasl.password"] = settings.sasl_password
    if settings.security_protocol.endswith("SSL"):
        if settings.ssl_ca_location:
            conf["ssl.ca.location"] = settings.ssl_ca_location
        if settings.ssl_certificate_location:
            conf["ssl.certificate.location"] = settings.ssl_certificate_location
        if settings.ssl_key_location:
            conf["ssl.key.location"] = settings.ssl_key_location
        conf["ssl.endpoint.identification.algorithm"] = "https" if settings.ssl_verify_hostname else "none"
    if settings.wan:
        conf.update({"socket.keepalive.enable": True, "socket.timeout.ms": 60000,
                     "metadata.max.age.ms": 60000})
    return conf


def producer_config(settings: KafkaSettings, **overrides: Any) -> dict[str, Any]:
    conf = client_config(settings)
    conf.update({
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": "lz4",
        "linger.ms": 100 if settings.wan else 5,
        "batch.size": (4 << 20) if settings.wan else (1 << 20),
        "message.max.bytes": settings.message_max_bytes + (1 << 16),
        "delivery.timeout.ms": 300_000 if settings.wan else 120_000,
    })
    conf.update(overrides)
    return conf


def consumer_config(settings: KafkaSettings, group: str, **overrides: Any) -> dict[str, Any]:
    conf = client_config(settings)
    conf.update({
        "group.id": settings.group(group),
        "enable.auto.commit": True,
        "enable.auto.offset.store": False,  # offsets are stored after processing: at-least-once
        "auto.offset.reset": "earliest",
        "fetch.message.max.bytes": settings.message_max_bytes + (1 << 16),
        "max.partition.fetch.bytes": settings.message_max_bytes + (1 << 16),
        "session.timeout.ms": 45_000 if settings.wan else 10_000,
        "heartbeat.interval.ms": 3_000 if settings.wan else 1_000,
        "max.poll.interval.ms": 600_000,
    })
    conf.update(overrides)
    return conf


def make_admin(settings: KafkaSettings) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient(client_config(settings))


def make_producer(settings: KafkaSettings, **overrides: Any) -> Any:
    from confluent_kafka import Producer

    return Producer(producer_config(settings, **overrides))


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

    def send(self, topic: str, record: Record, key: str | bytes | None = None,
             on_delivery: Callable[[Exception | None], None] | None = None,
             known_policies: frozenset[str] | None = None, lossy: bool = False) -> int:
        """Produce `record` to the base topic `topic` (namespace applied). Returns its size in bytes.
        A `lossy` record (metrics) that is not delivered is only counted in `lost_lossy`, never
        raised by `flush()`: metrics that timed out while the broker restarted made every
        component crash (or fail to stop) after the broker was back."""
        return self.send_raw(topic, encode(record, known_policies), key, on_delivery, lossy)

    def send_raw(self, topic: str, value: bytes, key: str | bytes | None = None,
                 on_delivery: Callable[[Exception | None], None] | None = None, lossy: bool = False) -> int:
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
                self.producer.produce(full, value=value, key=key, on_delivery=_done)
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
            raise DeliveryError("; ".join(errors[:5]) + (f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""))


class AtLeastOnceConsumer:
    """A consumer whose offsets advance only past messages the caller marked done."""

    def __init__(self, settings: KafkaSettings, group: str, topics: list[str], **overrides: Any) -> None:
        from confluent_kafka import Consumer

        self.settings = settings
        self.consumer = Consumer(consumer_config(settings, group, **overrides))
        self.topics = [settings.topic(t) for t in topics]
        self.consumer.subscribe(self.topics)

    def poll(self, timeout: float = 1.0) -> Any | None:
        """The next message, or None. Transport errors are logged; a fatal one raises."""
        from confluent_kafka import KafkaError, KafkaException

        msg = self.consumer.poll(timeout)
        if msg is None:
            return None
        err = msg.error()
        if err is not None:
            if err.fatal():
                raise KafkaException(err)
            if err.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error on %s: %s", self.topics, err)
            return None
        return msg

    def consume(self, num: int = 100, timeout: float = 1.0) -> list[Any]:
        from confluent_kafka import KafkaException

        out = []
        for msg in self.consumer.consume(num, timeout):
            err = msg.error()
            if err is None:
                out.append(msg)
            elif err.fatal():
                raise KafkaException(err)
        return out

    def done(self, msg: Any) -> None:
        """Mark `msg` processed: its offset (+1) will be committed."""
        self.consumer.store_offsets(message=msg)

    def commit(self) -> None:
        """Commit stored offsets now (synchronously)."""
        from confluent_kafka import KafkaException

        try:
            self.consumer.commit(asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].name() != "_NO_OFFSET":
                raise

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> AtLeastOnceConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_to_end(settings: KafkaSettings, topic: str, timeout: float = 60.0) -> list[tuple[float, Any]]:
    """Every record of the base topic `topic` as (broker timestamp in seconds, decoded record), read
    from the beginning to the end it had when called, with a throw-away group that commits nothing.
    Records that do not decode are skipped (this is for reports and benches, not for components)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition


    full = settings.topic(topic)
    consumer = Consumer(consumer_config(settings, f"reader-{uuid.uuid4().hex[:8]}", **{"enable.auto.commit": False}))
    try:
        meta = consumer.list_topics(full, timeout=15).topics.get(full)
        if meta is None or meta.error is not None or not meta.partitions:
            raise AstraFlowError(f"topic {full} does not exist")
        parts = meta.partitions
        high = {p: consumer.get_watermark_offsets(TopicPartition(full, p), timeout=15)[1] for p in parts}
        consumer.assign([TopicPartition(full, p, OFFSET_BEGINNING) for p in high])
        todo = {p for p, h in high.items() if h > 0}
        out: list[tuple[float, Any]] = []
        deadline = time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.5):
                if msg.error() is not None:
                    continue
                if (msg.offset() or 0) + 1 >= high[msg.partition()]:
                    todo.discard(msg.partition())
                try:
                    out.append((msg.timestamp()[1] / 1000.0, decode(msg.value() or b"")))
                except RecordError:
                    continue
        if todo:
            raise AstraFlowError(f"could not read {full} to its end within {timeout}s")
        return out
    finally:
        consumer.close()


class DeadLetters:
    """Publishes records a component could not use to `deadletter`, with their origin and reason."""

    TOPIC = "deadletter"

    def __init__(self, publisher: Publisher, component: str) -> None:
        self.publisher = publisher
        self.component = component
        self.count = 0

    def publish(self, source_topic: str, partition: int, offset: int, key: bytes | None, raw: bytes,
                error: str, on_delivery: Callable[[Exception | None], None] | None = None) -> None:
        """Produce the dead letter; `on_delivery` hears the broker's answer (commit the source
        offset only after it acknowledged)."""
        from astraflow.records.fields import MAX_BYTES

        limit = self.publisher.settings.message_max_bytes * 2 - (1 << 16)
        truncated = len(raw) > min(limit, MAX_BYTES)
        dead = DeadLetter(source_topic=source_topic, partition=partition, offset=offset, key=key,
                          raw=raw[: min(limit, MAX_BYTES)] if truncated else raw, error=error[:8192],
                          component=self.component, truncated=truncated)
        self.publisher.send(self.TOPIC, dead, key=key, on_delivery=on_delivery)
        self.count += 1
        log.warning("dead-lettered %s[%d]@%d: %s", source_topic, partition, offset, error)

    def publish_message(self, msg: Any, error: str,
                        on_delivery: Callable[[Exception | None], None] | None = None) -> None:
        self.publish(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value() or b"", error,
                     on_delivery)


def decode_or_deadletter(msg: Any, cls: type[R], dead: DeadLetters,
                         known_policies: frozenset[str] | None = None,
                         on_delivery: Callable[[Exception | None], None] | None = None) -> R | None:
    """Decode a consumed message as `cls`; a bad one goes to `deadletter` and None is returned."""
    try:
        return decode(msg.value() or b"", cls, known_policies)
    except RecordError as exc:
        dead.publish_message(msg, str(exc), on_delivery)
        return None


# --------------------------------------------------------------------------------------- Faust


def ssl_context(settings: KafkaSettings) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=settings.ssl_ca_location)
    ctx.check_hostname = settings.ssl_verify_hostname
    if settings.ssl_certificate_location:
        ctx.load_cert_chain(settings.ssl_certificate_location, settings.ssl_key_location)
    return ctx


def faust_settings(settings: KafkaSettings) -> dict[str, Any]:
    """Keyword arguments for `faust.App(...)` carrying the same connection settings."""
    import faust

    brokers = [f"kafka://{hp.strip()}" for hp in settings.require_bootstrap().split(",") if hp.strip()]
    out: dict[str, Any] = {
        "broker": brokers,
        "producer_max_request_size": settings.message_max_bytes + (1 << 16),
        "consumer_max_fetch_size": settings.message_max_bytes + (1 << 16),
        "broker_session_timeout": 45.0 if settings.wan else 10.0,
        "broker_heartbeat_interval": 3.0 if settings.wan else 1.0,
    }
    proto = settings.security_protocol
    if proto.startswith("SASL"):
        out["broker_credentials"] = faust.SASLCredentials(
            username=settings.sasl_username, password=settings.sasl_password,
            mechanism=settings.sasl_mechanism,
            ssl_context=ssl_context(settings) if proto == "SASL_SSL" else None,
        )
    elif proto == "SSL":
        out["broker_credentials"] = faust.SSLCredentials(ssl_context(settings))
    return out
