"""The `Sink`: every write the streams worker's emitter makes, and the waits of the crash protocol.

The emitter (streams/emission.py) carries out Emissions through this interface only, so the order
of its writes and waits, which is the protocol of streams/emit.py, can be checked in process against
a recording fake that crashes after any step (tests/streams/fake_sink.py). `KafkaSink` is the real
one: Faust topics and table changelogs through Faust's producer, dead letters through the worker's
confluent-kafka publisher, read-backs through a consumer of their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, Protocol

from astraflow.config.kafka import KafkaSettings
from astraflow.deadletters import DeadLetters
from astraflow.kafka import Publisher, partition_for
from streams.emit import read_back
from streams.plan import Letter
from streams.stats import StatsTable, TaskSummary


class Sink(Protocol):
    """Where an emission writes. A send returns the record's delivery: awaiting it waits for the
    broker's acknowledgement."""

    def written(self) -> list[Awaitable[Any]]:
        """Deliveries of the table writes (groups, bodies, task stats) since the last call."""
        ...

    async def send(self, topic: str, partition: int, key: bytes, value: bytes) -> Awaitable[Any]:
        """Produce a record of Samples."""
        ...

    async def send_summary(self, summary: TaskSummary, partition: int) -> list[Awaitable[Any]]:
        """Deliver a summary of a group of the `trajectories` partition `partition` to its task's
        statistics: to the internal task-update topic, or straight into the `task_stats` table when
        that partition is the task's own (nothing when there are no task statistics)."""
        ...

    async def publish_stats(self) -> None:
        """Produce the TaskStats of the tasks whose statistics changed since the last call."""
        ...

    def deadletter(self, letter: Letter) -> None:
        """Produce a dead letter; `flush_dead` waits for it."""
        ...

    async def flush_dead(self) -> None:
        """Wait until every dead letter produced so far is acknowledged."""
        ...

    async def send_now(self) -> None:
        """Send every record produced so far now, without waiting out the producer's linger."""
        ...

    async def read_back(
        self, targets: Iterable[tuple[str, int]], keys: set[str], since: float
    ) -> set[tuple[str, str]]:
        """(topic, traj_id) of the Samples keyed by one of `keys` on the target topic-partitions,
        written at or after `since` (streams/emit.py, `read_back`)."""
        ...


class KafkaSink:
    """The Sink of the running worker."""

    def __init__(
        self,
        app: Any,
        samples: dict[str, Any],
        task_updates: Any | None,
        tables: list[Any],
        dead: DeadLetters,
        publisher: Publisher,
        settings: KafkaSettings,
        stats: StatsTable | None = None,
    ) -> None:
        self.app, self.task_updates, self.tables, self.stats = app, task_updates, tables, stats
        self.dead, self.publisher, self.settings = dead, publisher, settings
        self.topics = {topic.get_topic_name(): topic for topic in samples.values()}  # name -> faust topic

    def written(self) -> list[Awaitable[Any]]:
        return [f for table in self.tables for f in table.written()]

    async def send(self, topic: str, partition: int, key: bytes, value: bytes) -> Awaitable[Any]:
        return await self.topics[topic].send(key=key, value=value, partition=partition)

    async def send_summary(self, summary: TaskSummary, partition: int) -> list[Awaitable[Any]]:
        """A task's summaries go to the partition of the internal topic its id hashes to, whose owner
        folds them into the table's partition of that number. A group that came from that partition
        of `trajectories` (workers send a task's groups there) is one this worker owns too (Faust
        assigns a partition number of every topic of the app to one worker): its summary is folded
        here, its writes acknowledged before the group is done like the record they replace. That
        saves a Kafka round trip, a Faust event and their wake-ups on every group."""
        if self.task_updates is None:
            return []
        task = summary["task"]
        if self.stats is not None and partition_for(task, self.task_updates.partitions) == partition:
            self.stats.counters.inc("task_stats.folded_at_emission")
            return self.stats.apply(summary, partition)
        return [await self.task_updates.send(key=task.encode(), value=summary)]

    async def publish_stats(self) -> None:
        if self.stats is not None:
            await self.stats.publish()

    def deadletter(self, letter: Letter) -> None:
        self.dead.publish(*letter)

    async def flush_dead(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.publisher.flush, 60.0)

    async def send_now(self) -> None:
        """End the producer's linger for what was just sent (see `_IdempotentProducer.send_now`)."""
        send_now = getattr(self.app.producer, "send_now", None)
        if send_now is not None:
            await send_now()

    async def read_back(
        self, targets: Iterable[tuple[str, int]], keys: set[str], since: float
    ) -> set[tuple[str, str]]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, read_back, self.settings, sorted(targets), keys, since)
