"""The librdkafka clients of every component: how each is configured from KafkaSettings, and made.

- `resolve`: the settings with ASTRAFLOW_* applied and, by default, the local broker's address.
- `client_config`: what every client shares (bootstrap, client id, SASL/SSL, WAN keepalive);
  `producer_config`: idempotent producers (acks=all, enable.idempotence); `consumer_config`.
- `accepting`: whether a bootstrap server takes a TCP connection (asked before any client exists).
- `make_admin`, `make_producer` (connected before its first record). Consumers are made in
  astraflow/kafka.py only (`make_consumer`), beside the reader that handles their errors.

confluent_kafka is imported by the functions that make a client, never at import time. The rest
of the code imports these from astraflow.kafka, which re-exports them beside `Publisher` and
`TopicReader`; `faust_settings` (astraflow/kafka_faust.py) are the same settings for Faust/aiokafka.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

from astraflow.config.kafka import KafkaSettings

WARM_TIMEOUT_S = 2.0  # make_producer: how long a new producer waits for its first connection


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
        conf.update(
            {"socket.keepalive.enable": True, "socket.timeout.ms": 60000, "metadata.max.age.ms": 60000}
        )
    return conf


def fetch_limit(settings: KafkaSettings) -> int:
    """The largest fetch or request a client makes: the largest record plus room for its batch."""
    return settings.message_max_bytes + (1 << 16)


def producer_config(settings: KafkaSettings, **overrides: Any) -> dict[str, Any]:
    conf = client_config(settings)
    conf.update(
        {
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "lz4",
            "linger.ms": 100 if settings.wan else 5,
            "batch.size": (4 << 20) if settings.wan else (1 << 20),
            "message.max.bytes": fetch_limit(settings),
            "delivery.timeout.ms": 300_000 if settings.wan else 120_000,
        }
    )
    conf.update(overrides)
    return conf


def consumer_config(settings: KafkaSettings, group: str, **overrides: Any) -> dict[str, Any]:
    conf = client_config(settings)
    conf.update(
        {
            "group.id": settings.group(group),
            "enable.auto.commit": True,
            "enable.auto.offset.store": False,  # offsets are stored after processing: at-least-once
            "auto.offset.reset": "earliest",
            "fetch.message.max.bytes": fetch_limit(settings),
            "max.partition.fetch.bytes": fetch_limit(settings),
            "session.timeout.ms": 45_000 if settings.wan else 10_000,
            "heartbeat.interval.ms": 3_000 if settings.wan else 1_000,
            "max.poll.interval.ms": 600_000,
            # How long the broker may hold an empty fetch. A consumer's other requests to that broker
            # (metadata, end offsets) queue behind it: at librdkafka's 500 ms, each end-offset look of
            # a reading consumer took 0.5 s (the run's final metrics drain 1.7 s, the feeder's start
            # 4 s, the trainer's partition check a 0.5 s stall). Data never waits for it.
            "fetch.wait.max.ms": 500 if settings.wan else 100,
        }
    )
    conf.update(overrides)
    return {k: v for k, v in conf.items() if v is not None}  # None: leave librdkafka's default


def make_admin(settings: KafkaSettings) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient(client_config(settings))


def make_producer(settings: KafkaSettings, **overrides: Any) -> Any:
    """An idempotent producer, connected. librdkafka asks for its producer id when it is created;
    with no broker connection up yet it retries 500 ms later, and every record waits for the id:
    each component's first delivery took 0.5 s (1 s on a new broker). A metadata request first
    (~60 ms) brings the connection up and the id with it. Best effort: a broker that does not
    answer within `WARM_TIMEOUT_S` is the producer's to retry, as before."""
    from confluent_kafka import KafkaException, Producer

    producer = Producer(producer_config(settings, **overrides))
    with contextlib.suppress(KafkaException):
        producer.list_topics(timeout=WARM_TIMEOUT_S)
    return producer


def accepting(bootstrap: str, timeout: float = 0.5) -> bool:
    """Whether any bootstrap server accepts a TCP connection (no Kafka client: librdkafka logs an
    error line for every refused connection while a broker boots)."""
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        with contextlib.suppress(OSError, ValueError):
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
            return True
    return False
