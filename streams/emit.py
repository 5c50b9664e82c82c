"""Exactly-once output of a group's Samples under at-least-once consumption.

Faust commits a `trajectories` offset only after flushing its producer, so a crash re-delivers
whatever was not committed and the group table (changelog-backed) comes back as of the last
flushed write. That alone leaves one window: Samples acknowledged, then a crash before the table
records the group as emitted; the restarted worker would emit the group again. The protocol
closes it:

1. before producing anything for a group, record `intent` (time, target topic-partitions) in the
   group table and flush the changelog;
2. produce the Samples (explicit partitions: murmur2 of the group_id) and wait for every ack;
3. mark the group `done` (flushed before the next offset commit), and only once that tombstone
   is acknowledged delete its trajectories.

The tombstone and the trajectories live in two tables, each with a changelog topic of its own, so a
crash may keep the writes of either without the other's. Deletes first, it could keep the deletes
and lose the tombstone: the group open, its trajectories gone, their offsets long committed; it
waited for a re-delivery that never came. Tombstone first, a crash leaves at worst the trajectories
of a done group, which a worker deletes once its tables are recovered.

A group that one record brought complete is held in memory instead (streams/grouping.py): its
record is acknowledged, so its offset committed, only after 3, and a crash before that delivers
the record again, whose trajectories stand in for the bodies the tables never had.

A worker that finds a group in `intent` (the previous one died between 1 and 3) reads the target
partitions back from the intent's time onwards (`read_back`, opening SampleBatch records) and
produces only the Samples that are not there. Samples are identified by (topic, traj_id),
which are deterministic. The one remaining race: a produce request of the dead worker that the
broker has received but not yet appended when the new worker reads back; the restart takes
seconds, the append milliseconds.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable

from astraflow.config.kafka import KafkaSettings
from astraflow.errors import RecordError
from astraflow.kafka import make_consumer
from astraflow.records import Sample, SampleBatch, decode, samples_of

log = logging.getLogger(__name__)
#: how far before the intent's time a read-back starts (clock granularity, not skew: the
#: Samples were stamped by the same process that wrote the intent)
READBACK_MARGIN_MS = 2_000


def read_back(
    settings: KafkaSettings,
    targets: Iterable[tuple[str, int]],
    keys: set[str],
    since_s: float,
    timeout_s: float = 60.0,
) -> set[tuple[str, str]]:
    """(topic, traj_id) of the Samples keyed by one of `keys` on the target topic-partitions,
    written at or after `since_s` (minus a margin). Blocking: run it in an executor."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    consumer = make_consumer(
        settings,
        f"streams-readback-{uuid.uuid4().hex[:8]}",  # never committed
        **{"enable.auto.commit": False, "enable.partition.eof": True},
    )
    found: set[tuple[str, str]] = set()
    wanted = {k.encode("utf-8") for k in keys}
    try:
        since_ms = max(0, int(since_s * 1000) - READBACK_MARGIN_MS)
        tps = [TopicPartition(t, p, since_ms) for t, p in sorted(set(targets))]
        starts = consumer.offsets_for_times(tps, timeout=timeout_s)
        assign, ends = [], {}
        for tp in starts:
            if tp.error is not None:
                raise KafkaException(tp.error)
            _, high = consumer.get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition), timeout=timeout_s
            )
            if tp.offset < 0 or tp.offset >= high:
                continue  # nothing written since the intent
            assign.append(TopicPartition(tp.topic, tp.partition, tp.offset))
            ends[(tp.topic, tp.partition)] = high
        if not assign:
            return found
        consumer.assign(assign)
        remaining = set(ends)
        while remaining:
            msg = consumer.poll(timeout_s)
            if msg is None:
                raise TimeoutError(f"read-back of {sorted(remaining)} stalled for {timeout_s}s")
            where = (msg.topic(), msg.partition())
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:  # noqa: SLF001 - confluent_kafka's public name
                    remaining.discard(where)
                    continue
                raise KafkaException(msg.error())
            if msg.offset() >= ends[where] - 1:
                remaining.discard(where)
            if msg.key() in wanted:
                try:
                    record = decode(msg.value() or b"", (Sample, SampleBatch))
                except RecordError as exc:  # not ours to judge here; it cannot be one we owe
                    log.warning("read-back: undecodable record at %s@%d: %s", where, msg.offset(), exc)
                    continue
                found.update((msg.topic(), sample.traj_id) for sample in samples_of(record))
        return found
    finally:
        consumer.close()
