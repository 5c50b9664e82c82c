"""What the Faust agents of streams/app.py do with each event: the thin layer between Faust and
the pure algorithms.

- `on_record`: validate each trajectory of a record (one, or a worker's batch of one group's; bad ->
  `deadletter`), add them to the group table (two writes a record, none for a record that brings
  its group complete: that record is acknowledged only once the group is done, so it stays the
  group's durable copy until then), queue the group for emission when complete.
- `sweep` (a timer): once the tables of newly assigned partitions are recovered, delete the bodies a
  crash left to groups already done; queue groups whose timeout passed, or that became complete
  without a new event (after a restart); forget emitted groups past their dedupe TTL; delete the
  bodies of groups whose done tombstones are acknowledged (streams/emission.py, step 6).
- `emitter` (a task, streams/emission.py): emits the queued groups in batches, through the Kafka
  sink of streams/sink.py.

Only the emitter emits. A group queued but not yet emitted is safe in a crash: its table entry is
flushed before its source offsets are committed, and the sweep queues it again after the restart;
a group held in memory has no committed offset yet, and its record comes again.
A trajectory of a group being emitted is dropped as the duplicate or the late arrival it is.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from astraflow.config.kafka import KafkaSettings
from astraflow.deadletters import DeadLetters
from astraflow.errors import RecordError
from astraflow.kafka import Publisher
from astraflow.metrics import MetricsReporter
from astraflow.records import Trajectory
from streams.bounded import LRU
from streams.emission import Emitter, failpoint_from_env
from streams.grouping import DONE, GroupCollector
from streams.pipeline import Pipeline
from streams.plan import Letter, Routes
from streams.recovery_watch import RecoveryStalled, RecoveryWatch
from streams.sink import KafkaSink
from streams.stats import StatsTable, parse_summary

log = logging.getLogger(__name__)
EX_SOFTWARE = 70


def fatal(app: Any, where: str, exc: BaseException) -> None:
    """An error that is not bad data (the broker gone for good, a bug): stop at once, like a crash.

    Nothing past the last committed offset is lost, and the protocol of streams/emit.py makes
    the restart safe, whereas letting Faust shut down cleanly could commit the failed event.
    An error raised while `app` stops is the stop, not a failure: a task still emitting meets a
    producer faust has already stopped (NotReady), and ends quietly; a stop mid-emission is as
    safe as a crash (CI: a guess_number run exited 1 after its 400 steps, streams' exit code 70
    at its SIGTERM)."""
    if getattr(app, "should_stop", False):
        log.info("streams: %s ended while stopping: %s: %s", where, type(exc).__name__, exc)
        return
    log.critical("streams: fatal error in %s: %s: %s", where, type(exc).__name__, exc, exc_info=exc)
    logging.shutdown()
    os._exit(EX_SOFTWARE)


class EndsSeen:
    """The watchdog's memory of the source partitions' end offsets: `look` keeps the ends of a look
    until they are `age_s` old, and hands them back then if no event came since (a new event starts
    a new look). `due` says whether a look now could hand any back, so an idle worker asks the
    broker for its ends once every `age_s`, not at every sweep."""

    def __init__(self, age_s: float) -> None:
        self.age_s = age_s
        self._seen: tuple[float, dict[Any, int], float] | None = None  # (when, ends, last event then)

    def due(self, now: float, last_event: float) -> bool:
        seen = self._seen
        return seen is None or seen[2] != last_event or now - seen[0] >= self.age_s

    def look(self, now: float, last_event: float, ends: dict[Any, int]) -> dict[Any, int] | None:
        seen = self._seen
        if seen is not None and seen[2] == last_event:
            if now - seen[0] < self.age_s:
                return None
            self._seen = None
            return seen[1]
        self._seen = (now, ends, last_event)
        return None


@dataclass
class Topics:
    """The Faust channels the runtime produces to, and the partition counts it routes with."""

    trajectories: str
    samples: dict[str, Any]  # policy -> faust topic
    sample_partitions: dict[str, int]
    task_updates: Any | None
    task_stats: Any | None


class StreamsRuntime:
    def __init__(
        self,
        app: Any,
        pipeline: Pipeline,
        collector: GroupCollector,
        topics: Topics,
        settings: KafkaSettings,
        stats_table: Any | None,
        instance_id: str,
        commit_every_s: float = 2.0,
        max_task_stats: int = 100_000,
        max_cached_trajectories: int = 16_384,
        recovery_stall_s: float = 30.0,
    ) -> None:
        self.app, self.pipeline, self.collector, self.topics = app, pipeline, collector, topics
        self.settings = settings
        self.commit_every_s = commit_every_s
        self.policies = frozenset(pipeline.ctx.policies)
        self.counters = pipeline.counters
        self.stats: StatsTable | None = None
        if stats_table is not None:
            self.stats = StatsTable(stats_table, topics.task_stats, self.counters, max_task_stats)
        # bounded (streams/bounded.py): a flood of groups must not grow them without end
        self.cache: LRU[str, Trajectory] = LRU(
            max_cached_trajectories, lambda: self.counters.inc("cache.evicted")
        )
        self.arrived: LRU[str, float] = LRU(
            max_cached_trajectories, lambda: self.counters.inc("arrived.evicted")
        )
        self.publisher = Publisher(settings)
        self.dead = DeadLetters(self.publisher, "streams")
        self.reporter = MetricsReporter(self.publisher, "streams", instance_id, region=settings.region)
        self.last_event = time.monotonic()
        self._was_ready = False
        self._ends = EndsSeen(commit_every_s)  # the watchdog's looks at the partitions' ends
        lose = failpoint_from_env(("lose_records",))
        self._lose = lose[1] if lose else 0  # records to drop unseen (crash tests of the watchdog)
        self._orphans_deleted: set[int] = set()  # the assigned partitions whose orphan bodies are gone
        self.recovery_watch = RecoveryWatch(
            app,
            recovery_stall_s,
            lambda why: fatal(app, "the table recovery", RecoveryStalled(why)),
        )
        tables = [t for t in (collector.bodies, collector.groups) if hasattr(t, "written")]
        self.sink = KafkaSink(
            app, topics.samples, topics.task_updates, tables, self.dead, self.publisher, settings, self.stats
        )
        routes = Routes(
            trajectories=topics.trajectories,
            samples={policy: topic.get_topic_name() for policy, topic in topics.samples.items()},
            partitions=topics.sample_partitions,
        )
        self.emitter = Emitter(
            collector,
            pipeline,
            routes,
            self.sink,
            cache=self.cache,
            arrived=self.arrived,
            failpoint=failpoint_from_env(),
        )

    def written(self) -> list[Any]:
        """Delivery futures of the table writes since the last call."""
        return self.sink.written()

    async def deadletter(self, letter: Letter, wait: bool = True) -> None:
        """Dead-letter one record and wait for the broker's ack: its offset may be committed next.
        `wait=False`: the caller waits once (`sink.flush_dead`) for several, before its offset is done."""
        self.sink.deadletter(letter)
        self.counters.inc("trajectories.deadlettered")
        self.counters.inc("deadletter.count")
        if wait:
            await self.sink.flush_dead()

    # ---------------------------------------------------------------- trajectories

    async def on_record(self, msg: Any, ack: Callable[[], Awaitable[Any]] | None = None) -> None:
        """One record of `trajectories`: a Trajectory, or a TrajectoryBatch of one group's.

        `ack` acknowledges the record (its offset may then be committed): called before this
        returns, or, for a record of a group held in memory (streams/grouping.py, `add_record`),
        by the emitter once that group is done. Without `ack` nothing is held."""
        if self._lose:  # the lose_records failpoint: as faust losing fetched records at a restart
            self._lose -= 1
            return
        held = await self._on_record(msg, ack is not None)
        if ack is not None:
            if held is not None:
                self.emitter.hold(held, ack)
            else:
                await ack()

    async def _on_record(self, msg: Any, hold: bool) -> str | None:
        """`on_record`; returns the held group that the record's acknowledgement must wait for."""
        c = self.counters
        self.last_event = time.monotonic()
        c.inc("records.in")
        t0 = time.perf_counter()
        try:
            items = self.pipeline.validate.split(msg.value, msg.key, self.policies)
        except RecordError as exc:  # the record as a whole: nothing of it is used
            c.inc("trajectories.in")
            c.inc("stage.validate.in")
            c.inc("stage.validate.deadlettered")
            await self.deadletter(
                Letter(msg.topic, msg.partition, msg.offset, msg.key, msg.value or b"", str(exc))
            )
            return None
        finally:
            c.observe("stage.validate.latency_ms", (time.perf_counter() - t0) * 1000.0)
        sent = self.dead.count
        gid = await self.on_trajectories(msg, items, hold)
        if self.dead.count != sent:  # a batch's bad trajectories: one wait for all their dead letters
            await self.sink.flush_dead()
        # a record of a held group, even a copy the group stage dropped, waits for the group: its
        # offset must not be committed while the group's state is in memory only (asked after the
        # wait for dead letters, during which the emitter may have finished the group)
        return gid if gid in self.collector.held else None

    async def on_trajectories(
        self, msg: Any, items: list[tuple[bytes, Trajectory | RecordError]], hold: bool = False
    ) -> str | None:
        """The trajectories of the record `msg`, each with its bytes, checked or why it was refused
        (dead-lettered alone, without waiting: `on_record` waits once). `hold`: see
        `GroupCollector.add_record`. Returns the record's group_id (None if no trajectory was valid)."""
        c = self.counters
        kept: list[tuple[Trajectory, bytes]] = []
        gid = None
        for raw, traj in items:
            c.inc("trajectories.in")
            c.inc("stage.validate.in")
            if isinstance(traj, RecordError):  # one bad trajectory of a batch: dead-lettered alone
                c.inc("stage.validate.deadlettered")
                await self.deadletter(
                    Letter(msg.topic, msg.partition, msg.offset, msg.key, raw, str(traj)), wait=False
                )
                continue
            c.inc("stage.validate.out")
            gid = traj.group_id
            self.pipeline.ctx.versions.observe(traj)
            c.inc("stage.group.in")
            if traj.group_id in self.emitter.emitting:  # its group's Samples are being produced without it
                meta = self.collector.groups.get(traj.group_id) or {}
                outcome = "duplicate" if traj.traj_id in meta.get("ids", ()) else "late"
                c.inc(f"stage.group.dropped.{outcome}")
                c.inc(f"trajectories.dropped.{outcome}")
                continue
            kept.append((traj, raw))
        now = time.time()
        added = self.collector.add_record(kept, msg.partition, now, msg.offset, hold=hold)
        self.written()  # durable by the flush before the next commit
        for (traj, raw), result in zip(kept, added, strict=True):
            if result.outcome == "inconsistent":
                c.inc("stage.group.deadlettered")
                reason = f"Trajectory {traj.traj_id}: {result.reason}"
                await self.deadletter(
                    Letter(msg.topic, msg.partition, msg.offset, msg.key, raw, reason), wait=False
                )
            elif result.outcome in ("duplicate", "late"):
                c.inc(f"stage.group.dropped.{result.outcome}")
                c.inc(f"trajectories.dropped.{result.outcome}")
            else:
                self.cache[traj.traj_id] = traj
                self.arrived[traj.group_id] = now
        if any(result.ready for result in added):
            self.emitter.enqueue(kept[0][0].group_id, "complete")
        if gid in self.collector.held and any(result.outcome == "added" for result in added):
            c.inc("groups.held")  # complete in this record: no table writes before its intent
        return gid

    # ---------------------------------------------------------------- sweep

    def _ready_for_sweep(self) -> bool:
        recovery = self.app.tables.recovery
        ready = not (self.app.rebalancing or recovery.in_recovery or not recovery.completed.is_set())
        if ready and not self._was_ready:
            self.last_event = time.monotonic()  # the watchdog's idle time counts from readiness
        self._was_ready = ready
        return ready

    def assigned_partitions(self) -> set[int]:
        return {
            tp.partition
            for tp in self.app.assignor.assigned_actives()
            if tp.topic == self.topics.trajectories
        }

    def source_topics(self) -> set[str]:
        """The topics the agents consume with acknowledgements (their offsets are committed)."""
        names = {self.topics.trajectories}
        if self.topics.task_updates is not None:
            names.add(self.topics.task_updates.get_topic_name())
        return names

    async def watchdog(self) -> None:
        """Re-seek to the committed offsets when a partition has records the worker never finished.

        faust 0.15.3 can lose track of records fetched around a rebalance: it skips a range of
        a partition and goes on after it, or stops fetching a partition at all (seen after
        about half of the restarts in the crash tests). The consumer never commits past a record
        that was not processed (streams/faust_glue.py, `_StrictConsumer`), so the commit stops
        there. Once nothing has arrived for two commit intervals, every partition should be
        committed up to the end it had a commit interval earlier (a later end may be records
        still in flight to the agent: a test that paused its input saw them delivered twice);
        if one is not, the flow is stopped, every such partition goes
        back to its committed offset (or to its earliest one, if retention deleted the records
        in between) and the flow resumes. What comes twice is dropped as a duplicate by the
        group stage."""
        idle_s = 2 * self.commit_every_s + 1.0
        if not self._ready_for_sweep() or time.monotonic() - self.last_event < idle_s:
            return
        consumer = self.app.consumer
        sources = self.source_topics()
        tps = [tp for tp in self.app.assignor.assigned_actives() if tp.topic in sources]
        if not tps:
            return
        # only records the broker already had a commit interval ago, with nothing arrived since,
        # count: ones that arrived a moment ago are still on their way to the agent (re-seeking for
        # them would deliver them twice)
        if not self._ends.due(time.monotonic(), self.last_event):
            return
        ends = await consumer.highwaters(*tps)
        old = self._ends.look(time.monotonic(), self.last_event, ends)
        if old is None:
            return
        stuck = []
        for tp in tps:
            committed = consumer.last_committed(tp) or 0
            end = old.get(tp)
            if end is not None and end > committed:
                stuck.append((tp, committed, end))
        if stuck:
            log.warning(
                "idle for %.0f s with uncommitted records (topic, partition, committed, end): %s; "
                "seeking back to the committed offsets",
                idle_s,
                [(tp.topic, tp.partition, c, e) for tp, c, e in stuck],
            )
            self.counters.inc("consumer.reseeks")
            starts = await consumer.earliest_offsets(*(tp for tp, *_ in stuck))
            consumer.stop_flow()
            try:
                for tp, committed, _ in stuck:  # aiokafka's seek_to_committed skips uncommitted partitions
                    target = max(committed, starts.get(tp) or 0)
                    if target > committed:  # deleted by retention: nothing left to wait for below it
                        consumer.assume_committed(tp, target)
                    await consumer.seek(tp, target)
            finally:
                consumer.resume_flow()
        self.last_event = time.monotonic()

    async def sweep(self) -> None:
        if not self._ready_for_sweep():
            return
        await self.watchdog()
        assigned = self.assigned_partitions()
        if assigned - self._orphans_deleted:  # at start-up, and after a rebalance brought partitions
            if self.stats is not None:
                self.stats.republish(assigned - self._orphans_deleted)
            deleted = await self.emitter.delete_orphans(assigned - self._orphans_deleted)
            if deleted:
                log.info("deleted %d body entries a crash left to groups already done", deleted)
                self.counters.inc("bodies.orphans_deleted", deleted)
        self._orphans_deleted = assigned
        await self.sink.publish_stats()
        for gid, action in self.collector.due(time.time(), assigned):
            if action == "expire":
                # a done group whose bodies wait for its tombstone's ack is kept until they are gone
                if gid not in self.emitter.emitting and gid not in self.emitter.unacked:
                    self.collector.forget(gid)
                    self.written()
            else:
                self.emitter.enqueue(gid, action)
        self.counters.gauge("groups.pending", self.collector.pending())
        self.counters.gauge(
            "trajectories.pending",
            sum(
                len(m["ids"])
                for _, m in self.collector.groups.items()
                if m is not None and m["state"] != DONE
            ),
        )
        await self.emitter.delete_done_bodies()  # when no batch follows to do it

    # ---------------------------------------------------------------- task stats

    async def on_task_update(self, event: Any) -> None:
        """Fold one group summary (raw msgpack bytes) into its task's statistics; a malformed one
        goes to `deadletter` with its reason (the agent would otherwise crash-loop on it)."""
        self.last_event = time.monotonic()
        msg = event.message
        try:
            summary = parse_summary(msg.value, msg.key)
        except RecordError as exc:
            self.counters.inc("task_updates.deadlettered")
            self.counters.inc("deadletter.count")
            self.dead.publish(msg.topic, msg.partition, msg.offset, msg.key, msg.value or b"", str(exc))
            await asyncio.get_running_loop().run_in_executor(None, self.publisher.flush, 60.0)
            return
        assert self.stats is not None  # the agent runs only with the task_stats stage
        self.stats.apply(summary, msg.partition)  # durable by the flush before the next commit
        await self.stats.publish()

    # ---------------------------------------------------------------- metrics

    def report(self) -> None:
        if self.stats is not None:
            self.counters.gauge("task_stats.tasks", self.stats.table.size())
        self.counters.gauge("cache.trajectories", len(self.cache))
        self.reporter.report(self.counters.snapshot())
        self.publisher.poll(0)

    def close(self) -> None:
        try:
            self.report()
        finally:
            self.publisher.flush(30.0)
