"""The trainer's input: `samples.<P>` read into its GroupBuffer (on the leader rank only).

Streams writes a group's Samples for a policy as one SampleBatch (single Sample records are read
too); every Sample of a batch counts at the batch's offset.

Partitions are assigned explicitly and positioned at the offsets stored in the last checkpoint
(Kafka's committed offsets are only informational, for lag monitoring); bad records go to
`deadletter`; partitions added to the topic later (`astraflow topics apply` grows them) are read
from their beginning once seen; retention that deleted samples past the checkpoint is reported
(trainer/retention.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from astraflow.config.kafka import KafkaSettings
from astraflow.deadletters import DeadLetters, decode_or_deadletter
from astraflow.errors import RecordError
from astraflow.kafka import TopicReader, partitions_of, watermarks
from astraflow.records import Sample, SampleBatch, batch_items
from trainer import retention
from trainer.batching import BadSample, GroupBuffer

log = logging.getLogger(__name__)
#: How often the leader looks for partitions added to its samples topic.
PARTITION_CHECK_S = 30.0


class SampleIntake:
    def __init__(
        self,
        settings: KafkaSettings,
        policy: str,
        buffer: GroupBuffer,
        dead: DeadLetters,
        policies: frozenset[str],
    ) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        self.buffer, self.dead, self.policies = buffer, dead, policies
        self.topic = settings.topic(f"samples.{policy}")
        self.reader = TopicReader(settings, group=f"trainer.{policy}", **{"enable.auto.commit": False})
        self.consumer: Any = self.reader.consumer
        #: offsets of the last checkpoint, to commit from the trainer's thread (set by any thread)
        self.uncommitted: dict[str, int] | None = None
        offsets = buffer.offsets()
        self.partitions = sorted(self.reader.end_offsets(self.topic))
        self.check_retention(offsets)
        self.consumer.assign(
            [TopicPartition(self.topic, p, offsets.get(p, OFFSET_BEGINNING)) for p in self.partitions]
        )
        self.partition_check = time.monotonic()

    def check_retention(self, offsets: dict[int, int]) -> None:
        """Say so when retention deleted samples past the checkpoint (trainer/retention.py)."""
        lows = {p: low for p, (low, _) in watermarks(self.consumer, self.topic, timeout=15.0).items()}
        found = retention.gaps(offsets, lows)
        if found:
            log.warning(retention.describe(self.topic, found))
            self.buffer.counts["samples.lost_to_retention"] += sum(low - off for off, low in found.values())

    def poll(self, timeout: float) -> None:
        """Wait up to `timeout` for the first message, then take whatever else is ready. (A batch
        `consume(n, timeout)` returns early only once it has n messages: with fewer it waited the
        whole timeout, which put 0.2 s into every step the trainer had to wait for.)"""
        self.commit_offsets()
        for msg in self.reader.poll_batch(timeout, 1000):
            self._intake(msg)

    def grow_partitions(self) -> None:
        """Read partitions added to the topic since we started (`astraflow topics apply` grows them).
        A broker that cannot answer now (down, restarting, no leader yet) is asked again at the next
        check: the trainer rides out a broker restart (a SIGKILLed broker crashed it here in
        tests/faults/test_broker_restart.py). A denied topic raises."""
        from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

        self.partition_check = time.monotonic()
        try:
            found = partitions_of(self.consumer, self.topic, timeout=5)
        except KafkaException as exc:
            log.warning(
                "%s: no metadata to look for new partitions (%s); trying again in %.0f s",
                self.topic,
                exc,
                PARTITION_CHECK_S,
            )
            return
        new = sorted(set(found) - set(self.partitions))
        if new:
            self.consumer.incremental_assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in new])
            self.partitions += new
            log.warning("%s: now also reading new partitions %s", self.topic, new)

    def _intake(self, msg: Any) -> None:
        """One message: a Sample, or a SampleBatch of one group's (each item checked on its own: a
        bad one is dead-lettered alone, with its own bytes and the batch's position)."""
        record = decode_or_deadletter(msg, (Sample, SampleBatch), self.dead, self.policies)
        if record is None:
            self.buffer.consumed(msg.partition(), msg.offset())
            return
        if isinstance(record, Sample):
            self._add(msg, record, msg.value() or b"")
            return
        for raw, sample in batch_items(record, Sample, self.policies):
            if isinstance(sample, RecordError):
                self.buffer.consumed(msg.partition(), msg.offset())
                self.dead.publish(msg.topic(), msg.partition(), msg.offset(), msg.key(), raw, str(sample))
            else:
                self._add(msg, sample, raw)

    def _add(self, msg: Any, sample: Sample, raw: bytes) -> None:
        try:
            self.buffer.add(sample, msg.partition(), msg.offset())
        except BadSample as exc:
            self.dead.publish(msg.topic(), msg.partition(), msg.offset(), msg.key(), raw, str(exc))

    def commit_offsets(self) -> None:
        """Tell Kafka how far the last checkpoint is, for lag monitoring only (restarts use the
        checkpoint). Called by the trainer's thread: a commit from another thread while the
        consumer polls hangs in confluent-kafka (seen here: it never returned)."""
        from confluent_kafka import KafkaException, TopicPartition

        offsets, self.uncommitted = self.uncommitted, None
        if offsets is None:
            return
        try:
            self.consumer.commit(
                offsets=[TopicPartition(self.topic, int(p), o) for p, o in offsets.items()], asynchronous=True
            )
        except KafkaException as exc:
            log.info("offset commit (informational) failed: %s", exc)

    def close(self) -> None:
        self.commit_offsets()
        self.reader.close()
