"""What the Faust agents of streams/app.py do with each event: the thin layer between Faust and
the pure algorithms.

- `on_trajectory`: validate (bad -> `deadletter`), add to the group table, emit when complete.
- `sweep` (a timer): emit groups whose timeout passed, or that became complete without a new
  event (after a restart), and forget emitted groups past their dedupe TTL.
- `emit`: run the group algorithms, route, and produce the Samples with the intent protocol of
  streams/emit.py, so a crash at any point neither loses nor duplicates a Sample.
- `on_task_update`: fold a group summary into the per-task statistics and publish TaskStats.

The agent and the timer share one asyncio lock: a group is never emitted by both.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from astraflow.config.kafka import KafkaSettings
from astraflow.errors import RecordError
from astraflow.kafka import DeadLetters, Publisher
from astraflow.metrics import MetricsReporter
from astraflow.records import Trajectory, decode, encode
from streams.api import Group
from streams.bounded import LRU
from streams.emit import partition_for, read_back
from streams.grouping import DONE, INTENT, Collector
from streams.pipeline import Pipeline, StageError
from streams.stats import dropped_summary, fold, parse_summary, to_record

log = logging.getLogger(__name__)
EX_SOFTWARE = 70


def _failpoint() -> tuple[str, int] | None:
    """Fault injection for the crash tests: ASTRAFLOW_STREAMS_FAILPOINT=mid_emit:N (SIGKILL after half
    of the N-th emitted group's Samples are acknowledged) or after_emit:N (after all of them,
    before the group is marked done)."""
    spec = os.environ.get("ASTRAFLOW_STREAMS_FAILPOINT", "")
    where, _, n = spec.partition(":")
    return (where, int(n)) if where in ("mid_emit", "after_emit") and n.isdigit() else None


def fatal(where: str, exc: BaseException) -> None:
    """An error that is not bad data (the broker gone for good, a bug): stop at once, like a crash.

    Nothing past the last committed offset is lost, and the protocol of streams/emit.py makes
    the restart safe, whereas letting Faust shut down cleanly could commit the failed event."""
    log.critical("streams: fatal error in %s: %s: %s", where, type(exc).__name__, exc, exc_info=exc)
    logging.shutdown()
    os._exit(EX_SOFTWARE)


@dataclass
class Topics:
    """The Faust channels the runtime produces to, and the partition counts it routes with."""

    trajectories: str
    samples: dict[str, Any]  # policy -> faust topic
    sample_partitions: dict[str, int]
    task_updates: Any | None
    task_stats: Any | None


class StreamsRuntime:
    def __init__(self, app: Any, pipeline: Pipeline, collector: Collector, topics: Topics,
                 settings: KafkaSettings, stats_table: Any | None, instance_id: str,
                 commit_every_s: float = 2.0, max_task_stats: int = 100_000,
                 max_cached_trajectories: int = 16_384) -> None:
        self.app, self.pipeline, self.collector, self.topics = app, pipeline, collector, topics
        self.settings, self.stats_table = settings, stats_table
        self.commit_every_s = commit_every_s
        self.policies = frozenset(pipeline.ctx.policies)
        self.counters = pipeline.counters
        self.lock = asyncio.Lock()
        self.max_task_stats = max_task_stats
        # bounded (streams/bounded.py): a flood of groups must not grow them without end
        self.cache: LRU[str, Trajectory] = LRU(max_cached_trajectories, lambda: self.counters.inc("cache.evicted"))
        self.arrived: LRU[str, float] = LRU(max_cached_trajectories, lambda: self.counters.inc("arrived.evicted"))
        self.publisher = Publisher(settings)
        self.dead = DeadLetters(self.publisher, "streams")
        self.reporter = MetricsReporter(self.publisher, "streams", instance_id, region=settings.region)
        self.last_event = time.monotonic()
        self._was_ready = False
        self.failpoint = _failpoint()
        self.emissions = 0
        self.tables = [t for t in (collector.bodies, collector.groups, stats_table) if hasattr(t, "written")]

    def written(self) -> list[Any]:
        """Delivery futures of the table writes since the last call."""
        return [f for table in self.tables for f in table.written()]

    # ---------------------------------------------------------------- trajectories

    async def on_trajectory(self, msg: Any) -> None:
        c = self.counters
        self.last_event = time.monotonic()
        c.inc("trajectories.in")
        c.inc("stage.validate.in")
        t0 = time.perf_counter()
        try:
            traj = self.pipeline.validate(msg.value, msg.key, self.policies)
        except RecordError as exc:
            c.inc("stage.validate.deadlettered")
            await self.deadletter(msg.topic, msg.partition, msg.offset, msg.key, msg.value or b"", str(exc))
            return
        finally:
            c.observe("stage.validate.latency_ms", (time.perf_counter() - t0) * 1000.0)
        c.inc("stage.validate.out")
        self.pipeline.ctx.versions.observe(traj)
        async with self.lock:
            c.inc("stage.group.in")
            now = time.time()
            added = self.collector.add(traj, msg.value, msg.partition, now, msg.offset)
            self.written()  # durable by the flush before the next commit
            if added.outcome == "inconsistent":
                c.inc("stage.group.deadlettered")
                await self.deadletter(msg.topic, msg.partition, msg.offset, msg.key, msg.value,
                                      f"Trajectory {traj.traj_id}: {added.reason}")
            elif added.outcome in ("duplicate", "late"):
                c.inc(f"stage.group.dropped.{added.outcome}")
                c.inc(f"trajectories.dropped.{added.outcome}")
            else:
                self.cache[traj.traj_id] = traj
                self.arrived[traj.group_id] = now
            if added.ready:
                await self.emit(traj.group_id, "complete")

    async def deadletter(self, topic: str, partition: int, offset: int, key: bytes | None, raw: bytes,
                         error: str) -> None:
        """Dead-letter one record and wait for the broker's ack: its offset may be committed next."""
        self.dead.publish(topic, partition, offset, key, raw, error)
        self.counters.inc("trajectories.deadlettered")
        self.counters.inc("deadletter.count")
        await asyncio.get_running_loop().run_in_executor(None, self.publisher.flush, 60.0)

    # ---------------------------------------------------------------- sweep

    def _ready_for_sweep(self) -> bool:
        recovery = self.app.tables.recovery
        ready = not (self.app.rebalancing or recovery.in_recovery or not recovery.completed.is_set())
        if ready and not self._was_ready:
            self.last_event = time.monotonic()  # the watchdog's idle time counts from readiness
        self._was_ready = ready
        return ready

    def assigned_partitions(self) -> set[int]:
        return {tp.partition for tp in self.app.assignor.assigned_actives()
                if tp.topic == self.topics.trajectories}

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
        committed up to its end; if one is not, the flow is stopped, every such partition goes
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
        ends = await consumer.highwaters(*tps)
        stuck = []
        for tp in tps:
            committed = consumer._committed_offset.get(tp) or 0  # faust's own record of its commits
            end = ends.get(tp)
            if end is not None and end > committed:
                stuck.append((tp, committed, end))
        if stuck:
            log.warning("idle for %.0f s with uncommitted records (topic, partition, committed, end): %s; "
                        "seeking back to the committed offsets", idle_s,
                        [(tp.topic, tp.partition, c, e) for tp, c, e in stuck])
            self.counters.inc("consumer.reseeks")
            starts = await consumer.earliest_offsets(*(tp for tp, *_ in stuck))
            consumer.stop_flow()
            try:
                for tp, committed, _ in stuck:  # aiokafka's seek_to_committed skips uncommitted partitions
                    target = max(committed, starts.get(tp) or 0)
                    if target > committed:  # deleted by retention: nothing left to wait for below it
                        consumer._committed_offset[tp] = target
                    await consumer.seek(tp, target)
            finally:
                consumer.resume_flow()
        self.last_event = time.monotonic()

    async def sweep(self) -> None:
        if not self._ready_for_sweep():
            return
        await self.watchdog()
        async with self.lock:
            for gid, action in self.collector.due(time.time(), self.assigned_partitions()):
                if action == "expire":
                    self.collector.forget(gid)
                    self.written()
                else:
                    await self.emit(gid, action)
        self.counters.gauge("groups.pending", self.collector.pending())
        self.counters.gauge("trajectories.pending", sum(
            len(m["ids"]) for _, m in self.collector.groups.items() if m is not None and m["state"] != DONE))

    # ---------------------------------------------------------------- emit

    def _group(self, gid: str, meta: dict[str, Any], complete: bool) -> Group | None:
        trajs = []
        for tid, raw in self.collector.bodies_of(gid):
            traj = self.cache.get(tid)
            if traj is None:
                if raw is None:  # lost in a crash; its re-delivery (not yet consumed) restores it
                    log.warning("group %s: waiting for the re-delivery of %s", gid, tid)
                    return None
                traj = decode(raw, Trajectory, self.policies)  # after a restart: validated bytes
            trajs.append(traj)
        return Group(group_id=gid, task_id=meta["task"], env=meta["env"], policies=list(meta["policies"]),
                     group_size=meta["size"], trajectories=trajs, complete=complete)

    async def emit(self, gid: str, action: str) -> None:
        """Finish one group (caller holds the lock)."""
        c = self.counters
        meta = self.collector.groups.get(gid)
        if meta is None or meta["state"] == DONE:
            return
        n = len(meta["ids"])
        if action == "timeout_drop":
            c.inc("groups.timeout_dropped")
            c.inc("stage.group.dropped.timeout", n)
            c.inc("trajectories.dropped.timeout", n)
            if self.pipeline.task_stats:  # it reaches no trainer: the feeder counts it consumed
                await self._send_summaries([dropped_summary(gid, meta["task"], meta["env"])])
            await self._finish(gid, meta)
            return
        group = self._group(gid, meta, complete=action == "complete")
        if group is None:
            c.inc("groups.waiting_for_bodies")
            return
        c.inc("groups.timeout_emitted" if action == "timeout_emit" else "groups.complete")
        c.inc("stage.group.out", n)
        try:
            outputs = self.pipeline.run(group)
            samples = self.pipeline.to_samples(outputs)
        except StageError as exc:
            # a stage (often a plug-in) failed on this group: its trajectories go to deadletter
            offsets = self.collector.offsets(meta)
            for (tid, raw), offset in zip(self.collector.bodies_of(gid), offsets, strict=True):
                await self.deadletter(self.topics.trajectories, meta["p"], offset, gid.encode(), raw,
                                      f"Trajectory {tid}: {exc}")
            # the group reaches no trainer: its task statistics say so (the feeder counts it consumed)
            await self._send_summaries([dict(s, dropped=True) for stage in self.pipeline.task_stats
                                        for s in stage.take()])
            await self._finish(gid, meta)
            return
        summaries = [s for stage in self.pipeline.task_stats for s in stage.take()]
        reached = {s.policy for s in samples if s.group_id == gid}
        for summary in summaries:  # a group that reaches no trainer of some policy: the feeder counts it consumed
            summary["dropped"] = summary["gid"] == gid and not set(group.policies) <= reached
        records = [(s.policy, partition_for(s.group_id, self.topics.sample_partitions[s.policy]), s)
                   for s in samples]
        emitted = bool(records)
        if records:
            targets = sorted({(self.topics.samples[p].get_topic_name(), part) for p, part, _ in records})
            if meta["state"] == INTENT:
                records = await self._recover(gid, meta, records)
            else:
                self.collector.mark_intent(gid, time.time(), targets)
                await self.send_now()
                await asyncio.gather(*self.written())  # the intent is durable before any Sample exists
        futures = []
        self.emissions += bool(records)
        for i, (policy, part, sample) in enumerate(records):
            if i == len(records) // 2:
                await self._maybe_fail("mid_emit", futures)
            topic = self.topics.samples[policy]
            futures.append(await topic.send(key=sample.group_id.encode(), value=encode(sample, self.policies),
                                            partition=part))
            c.inc(f"samples.out.{policy}")
        futures += await self._send_summaries(summaries, wait=False)
        await self.send_now()
        await asyncio.gather(*futures)
        await self._maybe_fail("after_emit", futures)
        done = time.time()
        if emitted:
            c.inc("groups.emitted")
            if gid in self.arrived:
                c.observe("latency.emit_ms", (done - self.arrived[gid]) * 1000.0)
            newest = max((t.created_at for t in group.trajectories), default=done)
            c.observe("latency.e2e_ms", max(0.0, done - newest) * 1000.0)
        await self._finish(gid, meta)

    async def send_now(self) -> None:
        """End the producer's linger for what was just sent (see `_IdempotentProducer.send_now`)."""
        send_now = getattr(self.app.producer, "send_now", None)
        if send_now is not None:
            await send_now()

    async def _send_summaries(self, summaries: list[dict[str, Any]], wait: bool = True) -> list:
        futures = []
        if self.topics.task_updates is not None:
            for summary in summaries:
                futures.append(await self.topics.task_updates.send(key=summary["task"].encode(), value=summary))
        if wait:
            await asyncio.gather(*futures)
        return futures

    async def _maybe_fail(self, where: str, futures: list) -> None:
        if self.failpoint == (where, self.emissions):
            await asyncio.gather(*futures)
            log.warning("failpoint %s:%d: SIGKILL", where, self.emissions)
            os.kill(os.getpid(), signal.SIGKILL)

    async def _recover(self, gid: str, meta: dict[str, Any], records: list[tuple[str, int, Any]]) -> list:
        """A previous worker died while emitting this group: send only what is not on the topics."""
        targets = [(t, p) for t, p in meta.get("targets", [])]
        targets += [(self.topics.samples[pol].get_topic_name(), part) for pol, part, _ in records]
        keys = {s.group_id for _, _, s in records}
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(None, read_back, self.settings, targets, keys, meta["at"])
        missing = [r for r in records
                   if (self.topics.samples[r[0]].get_topic_name(), r[2].traj_id) not in found]
        self.counters.inc("groups.recovered")
        self.counters.inc("samples.recovered", len(records) - len(missing))
        log.warning("group %s: recovered an interrupted emission; %d of %d Samples were already on the "
                    "topics", gid, len(records) - len(missing), len(records))
        return missing

    async def _finish(self, gid: str, meta: dict[str, Any]) -> None:
        for tid in meta["ids"]:
            self.cache.pop(tid, None)
        self.arrived.pop(gid, None)
        self.collector.mark_done(gid, time.time())
        self.written()

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
        task = summary["task"]
        state, applied = fold(self.stats_table.get(task), summary)
        if not applied:
            self.counters.inc("task_stats.duplicates")
            return
        state = {**state, "at": time.time(), "p": msg.partition}  # for the eviction below
        self.stats_table.set(task, state, msg.partition)
        self._evict_task_stats()
        self.written()
        record = to_record(task, state)
        await self.topics.task_stats.send(key=task.encode(), value=encode(record))
        self.counters.inc("task_stats.published")

    def _evict_task_stats(self) -> None:
        """Past `max_task_stats` tasks, delete the least recently updated tenth (one scan per
        tenth of the limit, so the cost per update stays small)."""
        size = self.stats_table.size()
        if size <= self.max_task_stats:
            return
        keep = self.max_task_stats - self.max_task_stats // 10
        oldest = sorted(self.stats_table.items(), key=lambda kv: (kv[1] or {}).get("at", 0.0))[: size - keep]
        for task, state in oldest:
            self.stats_table.delete(task, (state or {}).get("p", 0))
        self.counters.inc("task_stats.evicted", len(oldest))

    # ---------------------------------------------------------------- metrics

    def report(self) -> None:
        if self.stats_table is not None:
            self.counters.gauge("task_stats.tasks", self.stats_table.size())
        self.counters.gauge("cache.trajectories", len(self.cache))
        self.reporter.report(self.counters.snapshot())
        self.publisher.poll(0)

    def close(self) -> None:
        try:
            self.report()
        finally:
            self.publisher.flush(30.0)
