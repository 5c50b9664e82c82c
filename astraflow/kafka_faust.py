"""The connection settings of astraflow/kafka_clients.py for Faust and aiokafka (the streams worker), SASL_SSL
included: one KafkaSettings drives both client libraries."""

from __future__ import annotations

import ssl
from typing import Any

from astraflow.config.kafka import KafkaSettings
from astraflow.kafka_clients import fetch_limit


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
        "producer_max_request_size": fetch_limit(settings),
        "consumer_max_fetch_size": fetch_limit(settings),
        "broker_session_timeout": 45.0 if settings.wan else 10.0,
        "broker_heartbeat_interval": 3.0 if settings.wan else 1.0,
    }
    proto = settings.security_protocol
    if proto.startswith("SASL"):
        out["broker_credentials"] = faust.SASLCredentials(
            username=settings.sasl_username,
            password=settings.sasl_password,
            mechanism=settings.sasl_mechanism,
            ssl_context=ssl_context(settings) if proto == "SASL_SSL" else None,
        )
    elif proto == "SSL":
        out["broker_credentials"] = faust.SSLCredentials(ssl_context(settings))
    return out
