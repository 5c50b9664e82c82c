"""The optional lockstep barrier between policies, learnt from the `weights` topic.

With `trainer.lockstep: true`, a policy's trainer at version n does not start a step towards
version n+1 until every other policy of the recipe has published version n. Progress is read from
the compacted `weights` topic (latest event per policy), so trainers never talk to each other and
a restarted trainer recovers the others' progress by re-reading the topic.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from astraflow.config.kafka import KafkaSettings
from astraflow.errors import RecordError
from astraflow.kafka import consumer_config
from astraflow.records import WeightVersion, decode
from astraflow.weights.auth import verify

log = logging.getLogger(__name__)


class PolicyVersions:
    """Latest published version of every other policy (-1 until seen)."""

    def __init__(self, settings: KafkaSettings, policy: str, policies: list[str]) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.others = [p for p in policies if p != policy]
        self.versions: dict[str, int] = dict.fromkeys(self.others, -1)
        topic = settings.topic("weights")
        # a private group id: this consumer only reads (assign + no commits), never joins a group
        conf = consumer_config(settings, f"trainer.{policy}.lockstep.{uuid.uuid4().hex[:8]}",
                               **{"enable.auto.commit": False})
        self.consumer: Any = Consumer(conf)
        parts = self.consumer.list_topics(topic, timeout=15).topics[topic].partitions
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])

    def poll(self) -> None:
        for msg in self.consumer.consume(500, timeout=0.05):
            if msg.error() is not None:
                continue
            try:
                event = verify(decode(msg.value() or b"", WeightVersion))
            except RecordError as exc:  # the weights topic is the trainers' own: log, do not stop
                log.warning("unreadable weights event at %s[%d]@%d: %s", msg.topic(), msg.partition(),
                            msg.offset(), exc)
                continue
            if event.policy in self.versions:
                self.versions[event.policy] = max(self.versions[event.policy], event.version)

    def ready(self, version: int) -> bool:
        """May this trainer, at `version`, start a step towards `version + 1`?"""
        self.poll()
        return all(v >= version for v in self.versions.values())

    def close(self) -> None:
        self.consumer.close()
