"""The local Apache Kafka broker (`astraflow broker start|stop|status`)."""

from astraflow.broker.launcher import (
    BrokerState,
    default_data_dir,
    ensure_jars,
    find_java,
    kafka_version,
    local_bootstrap,
    start,
    status,
    stop,
)

__all__ = [
    "BrokerState",
    "default_data_dir",
    "ensure_jars",
    "find_java",
    "kafka_version",
    "local_bootstrap",
    "start",
    "status",
    "stop",
]
