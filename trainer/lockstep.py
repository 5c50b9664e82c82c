"""The optional lockstep barrier between policies, learnt from the `weights` topic.

With `trainer.lockstep: true`, a policy's trainer at version n does not start a step towards
version n+1 until every other policy of the recipe has published version n. Progress is read from
the compacted `weights` topic (latest event per policy), so trainers never talk to each other and
a restarted trainer recovers the others' progress by re-reading the topic.
"""

from __future__ import annotations

import logging
import uuid

from astraflow.config.kafka import KafkaSettings
from astraflow.errors import RecordError
from astraflow.kafka import TopicReader
from astraflow.records import WeightVersion, decode
from astraflow.weights.auth import verify

log = logging.getLogger(__name__)


class PolicyVersions:
    """Latest published version of every other policy (-1 until seen)."""

    def __init__(self, settings: KafkaSettings, policy: str, policies: list[str]) -> None:
        self.others = [p for p in policies if p != policy]
        self.versions: dict[str, int] = dict.fromkeys(self.others, -1)
        # a private group id: this consumer only reads (assign + no commits), never joins a group
        group = f"trainer.{policy}.lockstep.{uuid.uuid4().hex[:8]}"
        self.reader = TopicReader(
            settings, ["weights"], group=group, from_beginning=True, **{"enable.auto.commit": False}
        )

    def poll(self) -> None:
        for msg in self.reader.consume(500, timeout=0.05):
            try:
                event = verify(decode(msg.value() or b"", WeightVersion))
            except RecordError as exc:  # the weights topic is the trainers' own: log, do not stop
                log.warning(
                    "unreadable weights event at %s[%d]@%d: %s",
                    msg.topic(),
                    msg.partition(),
                    msg.offset(),
                    exc,
                )
                continue
            if event.policy in self.versions:
                self.versions[event.policy] = max(self.versions[event.policy], event.version)

    def ready(self, version: int) -> bool:
        """May this trainer, at `version`, start a step towards `version + 1`?"""
        self.poll()
        return all(v >= version for v in self.versions.values())

    def close(self) -> None:
        self.reader.close()
