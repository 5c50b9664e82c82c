"""Metrics are lossy, data is not: a Metric record that cannot be delivered (the broker is gone, as
while it restarts) is counted, not raised by `Publisher.flush()`. Raising it made every component
crash, or fail to stop, once a restarted broker was back (tests/faults/test_broker_restart.py)."""

from __future__ import annotations

import pytest

from astraflow.config import KafkaSettings
from astraflow.kafka import DeliveryError, Publisher
from astraflow.metrics import MetricsReporter
from astraflow.records import Task

pytestmark = [pytest.mark.faults]


def test_an_undelivered_metric_is_counted_an_undelivered_task_is_raised() -> None:
    nowhere = KafkaSettings(bootstrap="127.0.0.1:1")  # nothing listens: every delivery times out
    pub = Publisher(nowhere, **{"message.timeout.ms": 300})
    MetricsReporter(pub, "feeder", "feeder").report({"feeder.published": 1.0})
    pub.flush(10)  # only a metric was lost: nothing to raise
    assert pub.lost_lossy == 1
    task = Task(task_id="t", env="arithmetic", roles={"solver": "p"}, group_size=2, prompt="1+1=", seed=0)
    pub.send("tasks", task, key="t")
    with pytest.raises(DeliveryError, match="tasks"):
        pub.flush(10)
