"""The emitter of the streams worker (streams/runtime.py): it turns complete groups into Samples.

An emitter task drains a queue of groups in batches, everything queued while one batch is emitted
forming the next. For each group `plan_emission` (streams/plan.py) decides what must be written;
the `Emitter` only carries those Emissions out, through a `Sink` (streams/sink.py), in the order
that makes a crash at any point lose no Sample and duplicate none (the protocol of streams/emit.py):

1. a group that makes no Sample (dropped at its timeout, or failed by a stage) is finished at once:
   its dead letters are acknowledged, then its task summaries, then it is marked done;
2. the intents of the batch's other groups are written; a group whose intent a previous worker
   wrote is read back, and only its Samples that are not on the topics remain to be produced;
3. every intent is acknowledged before any Sample is produced;
4. the Samples and task summaries of every group are produced, and all acknowledged (a summary of a
   group on its task's partition is folded into the `task_stats` table instead, and that write is
   acknowledged; streams/sink.py, `KafkaSink.send_summary`);
5. only then is each group marked done, durable by the flush before the next offset commit; the
   batch's TaskStats are published after it (`Sink.publish_stats`). A group held in memory
   (streams/grouping.py: its record's offset waits for it) has its record acknowledged now, so that
   commit covers its tombstone; one that ends a batch without being done is written to the tables
   first (`GroupCollector.persist`);
6. its bodies are deleted once that tombstone is acknowledged (`delete_done_bodies`: by the next
   batch, after its Samples' acknowledgements, which cover the tombstones written before them,
   or by the runtime's next sweep). A crash that keeps the deletes keeps the tombstone; one that
   keeps the tombstone but loses the deletes leaves bodies that no group needs, deleted when
   the tables are next recovered (`delete_orphans`).

A batch pays the protocol's two awaited round trips (3 and 4) once for all its groups (the wait of
6 costs none of its own); one group at a time, the groups of a training step queued behind each
other's round trips.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from astraflow.records import Trajectory, decode, encode
from streams.api import Group
from streams.grouping import DONE, GroupCollector, OpenGroup
from streams.pipeline import Pipeline
from streams.plan import Emission, Routes, pack, plan_emission
from streams.sink import Sink
from streams.stats import TaskSummary

log = logging.getLogger(__name__)


EMIT_FAILPOINTS = ("mid_emit", "after_emit", "before_delete")


def failpoint_from_env(names: tuple[str, ...] = EMIT_FAILPOINTS) -> tuple[str, int] | None:
    """Fault injection for the crash tests: ASTRAFLOW_STREAMS_FAILPOINT=mid_emit:N (SIGKILL after the
    first half of the N-th emitted group's Samples are acknowledged), after_emit:N (after all the Samples
    of the N-th group's batch are, before any group of the batch is marked done) or before_delete:N
    (once the done tombstones of N groups are acknowledged, before the bodies of the last are deleted);
    another module's failpoints by their `names` (stall_recovery:1, streams/recovery_watch.py;
    lose_records:N, streams/runtime.py: the first N records are dropped unprocessed and unacknowledged,
    as faust 0.15.3 lost fetched records at some restarts)."""
    spec = os.environ.get("ASTRAFLOW_STREAMS_FAILPOINT", "")
    where, _, n = spec.partition(":")
    return (where, int(n)) if where in names and n.isdigit() else None


class Emitter:
    """Emits the groups queued by the runtime: plans each, then writes the plans to `sink`.

    `cache` (traj_id -> Trajectory) and `arrived` (group_id -> when its last trajectory came) are
    the runtime's, filled as trajectories arrive; an emitted group's entries leave them."""

    def __init__(
        self,
        collector: GroupCollector,
        pipeline: Pipeline,
        routes: Routes,
        sink: Sink,
        *,
        cache: Any,
        arrived: Any,
        failpoint: tuple[str, int] | None = None,
    ) -> None:
        self.collector, self.pipeline, self.routes, self.sink = collector, pipeline, routes, sink
        self.counters = pipeline.counters
        self.policies = frozenset(pipeline.ctx.policies)
        self.cache, self.arrived = cache, arrived
        self.failpoint = failpoint
        self.queue: dict[str, str] = {}  # gid -> action, in the order queued
        self.emitting: set[str] = set()
        # gid -> (the deliveries of its done tombstone, its partition, its body keys): the groups
        # marked done whose bodies wait for the tombstone's acknowledgement; emptied by every batch
        # and every sweep, so it holds at most the groups done since then
        self.unacked: dict[str, tuple[list[Any], int, list[str]]] = {}
        self.emissions = 0  # groups whose Samples were produced (the failpoints count them)
        self.tombstones_acked = 0  # groups whose done tombstones were acknowledged (before_delete)
        # gid -> the acknowledgements of the records of a group held in memory (`hold`)
        self.holds: dict[str, list[Callable[[], Awaitable[Any]]]] = {}
        self._released: list[Callable[[], Awaitable[Any]]] = []
        self._wake = asyncio.Event()

    def hold(self, gid: str, ack: Callable[[], Awaitable[Any]]) -> None:
        """Acknowledge a record of the held group `gid` (its offset may then be committed) only once
        the group is done, or written to the tables."""
        self.holds.setdefault(gid, []).append(ack)

    def enqueue(self, gid: str, action: str) -> None:
        """Queue a group for the emitter (a complete group is emitted as complete, even if a
        timeout queued it first)."""
        if gid in self.emitting:
            return
        if action == "complete" or gid not in self.queue:
            self.queue[gid] = action
        self._wake.set()

    async def run(self) -> None:
        """Emit what is queued, in batches: everything queued while a batch is emitted is the next."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self.queue = list(self.queue.items()), {}
            if not batch:
                continue
            self.emitting.update(gid for gid, _ in batch)
            self.counters.inc("emit.batches")
            try:
                await self.emit(batch)
            finally:
                self.emitting.difference_update(gid for gid, _ in batch)
            await self.sink.publish_stats()  # after the batch: its Samples wait for none of them

    async def emit(self, batch: list[tuple[str, str]]) -> None:
        """Finish the groups of `batch` ((gid, action) pairs): the intents of all of them are made
        durable together, then all their Samples are produced and acknowledged together."""
        await self._emit(batch)
        await self._release(batch)  # not after a failure: that stops the worker, as a crash would

    async def _emit(self, batch: list[tuple[str, str]]) -> None:
        emissions = []
        for gid, action in batch:
            emission = self.plan(gid, action)
            if emission is not None and emission.outcome == "emit":
                emissions.append(emission)
            elif emission is not None:
                await self._finish_without_samples(emission)
        fresh = [e for e in emissions if e.intent]
        now = time.time()
        for e in fresh:
            self.collector.mark_intent(e.gid, now, e.intent or [])
        intents = self.sink.written()  # taken before any await: other writes may follow meanwhile
        emissions = await self._recover(emissions)
        if fresh:
            await self.sink.send_now()
            await asyncio.gather(*intents)  # the intents are durable before any Sample exists
        futures: list[Any] = []
        numbers = []
        for e in emissions:
            self.emissions += bool(e.samples)
            numbers.append(self.emissions)
            outgoing = pack(e.samples, self.policies, halves=self.failpoint == ("mid_emit", self.emissions))
            for i, out in enumerate(outgoing):
                if i == len(outgoing) // 2:
                    await self._maybe_fail("mid_emit", self.emissions, e.gid, futures)
                value = encode(out.batch, self.policies)
                futures.append(await self.sink.send(out.topic, out.partition, out.key, value))
                self.counters.inc(f"samples.out.{out.policy}", len(out.batch.items))
            futures += await self._send_summaries(e.summaries, e.meta["p"])
        await self.sink.send_now()
        await asyncio.gather(*futures)
        await self.delete_done_bodies()  # the tombstones written before the send are acknowledged
        done = time.time()
        for e, number in zip(emissions, numbers, strict=True):
            if e.samples:
                await self._maybe_fail("after_emit", number, e.gid, futures)
            if e.emitted:
                self.counters.inc("groups.emitted")
                if e.gid in self.arrived:
                    self.counters.observe("latency.emit_ms", (done - self.arrived[e.gid]) * 1000.0)
                newest = done if e.newest is None else e.newest
                self.counters.observe("latency.e2e_ms", max(0.0, done - newest) * 1000.0)
            self._finish(e.gid, e.meta)

    def plan(self, gid: str, action: str) -> Emission | None:
        """The Emission of one queued group; None when it is gone, done, or waits for bodies."""
        meta = self.collector.meta(gid)
        if meta is None or meta["state"] == DONE:
            return None
        group, bodies = None, []
        if action != "timeout_drop":
            bodies = self.collector.bodies_of(gid)
            group = self._group(gid, meta, bodies, complete=action == "complete")
            if group is None:
                self.counters.inc("groups.waiting_for_bodies")
                return None
        emission = plan_emission(
            gid, meta, action, group, pipeline=self.pipeline, routes=self.routes, bodies=bodies
        )
        for name, n in emission.counts.items():
            self.counters.inc(name, n)
        return emission

    def _group(
        self, gid: str, meta: OpenGroup, bodies: list[tuple[str, bytes | None]], complete: bool
    ) -> Group | None:
        trajs = []
        for tid, raw in bodies:
            traj = self.cache.get(tid)
            if traj is None:
                if raw is None:  # lost in a crash; its re-delivery (not yet consumed) restores it
                    log.warning("group %s: waiting for the re-delivery of %s", gid, tid)
                    return None
                traj = decode(raw, Trajectory, self.policies)  # after a restart: validated bytes
            trajs.append(traj)
        return Group(
            group_id=gid,
            task_id=meta["task"],
            env=meta["env"],
            policies=list(meta["policies"]),
            group_size=meta["size"],
            trajectories=trajs,
            complete=complete,
        )

    async def _finish_without_samples(self, emission: Emission) -> None:
        """A group dropped or failed: its dead letters, then its summaries, each acknowledged, then done."""
        for letter in emission.letters:
            self.sink.deadletter(letter)
            self.counters.inc("trajectories.deadlettered")
            self.counters.inc("deadletter.count")
        if emission.letters:
            await self.sink.flush_dead()  # one wait for the group's dead letters
        await asyncio.gather(*await self._send_summaries(emission.summaries, emission.meta["p"]))
        self._finish(emission.gid, emission.meta)

    async def _send_summaries(self, summaries: list[TaskSummary], partition: int) -> list[Any]:
        """Deliver the summaries of a group of `partition`; the deliveries to wait for."""
        return [d for summary in summaries for d in await self.sink.send_summary(summary, partition)]

    async def _maybe_fail(self, where: str, number: int, gid: str, futures: list) -> None:
        if self.failpoint == (where, number):
            await asyncio.gather(*futures)
            log.warning("failpoint %s:%d (group %s): SIGKILL", where, number, gid)
            os.kill(os.getpid(), signal.SIGKILL)

    async def _recover(self, emissions: list[Emission]) -> list[Emission]:
        """A previous worker died while emitting some of these groups: keep in each of those only
        the Samples that are not on the topics (one read-back for all of them)."""
        interrupted = [e for e in emissions if e.recovers]
        if not interrupted:
            return emissions
        targets = {(t, part) for e in interrupted for t, part in e.meta.get("targets", [])}
        targets |= {(r.topic, r.partition) for e in interrupted for r in e.samples}
        keys = {r.sample.group_id for e in interrupted for r in e.samples}
        found = await self.sink.read_back(targets, keys, min(e.meta["at"] for e in interrupted))
        out = []
        for e in emissions:
            if e.recovers:
                missing = [r for r in e.samples if (r.topic, r.sample.traj_id) not in found]
                there = len(e.samples) - len(missing)
                self.counters.inc("groups.recovered")
                self.counters.inc("samples.recovered", there)
                log.warning(
                    "group %s: recovered an interrupted emission; "
                    "%d of %d Samples were already on the topics",
                    e.gid,
                    there,
                    len(e.samples),
                )
                e = dataclasses.replace(e, samples=missing)
            out.append(e)
        return out

    def _finish(self, gid: str, meta: OpenGroup) -> None:
        for tid in meta["ids"]:
            self.cache.pop(tid, None)
        self.arrived.pop(gid, None)
        keys = self.collector.mark_done(gid, time.time())
        written = self.sink.written()
        if keys:  # a held group has no bodies in the tables: nothing waits for its tombstone
            self.unacked[gid] = (written, meta["p"], keys)
        self._released += self.holds.pop(gid, [])

    async def _release(self, batch: list[tuple[str, str]]) -> None:
        """Acknowledge the records of the batch's held groups that are done; a held group that is
        not (it waits, or the batch failed) is written to the tables first, so that no commit of its
        record can come before its state is durable."""
        for gid, _ in batch:
            if gid in self.holds:
                self.collector.persist(gid)
                self.sink.written()  # durable by the flush before the next commit
                self._released += self.holds.pop(gid)
        acks, self._released = self._released, []
        for ack in acks:
            await ack()

    async def delete_done_bodies(self) -> None:
        """Delete the bodies of the groups marked done, once their tombstones are acknowledged
        (never before: step 6 of the protocol above). The deletes are durable by the flush before
        the next offset commit; the ones a crash loses are orphans for `delete_orphans`."""
        waiting = list(self.unacked.items())
        if not waiting:
            return
        await asyncio.gather(*(delivery for _, (deliveries, _, _) in waiting for delivery in deliveries))
        before, self.tombstones_acked = self.tombstones_acked, self.tombstones_acked + len(waiting)
        where, number = self.failpoint or ("", 0)
        if where == "before_delete" and before < number <= self.tombstones_acked:
            await self._maybe_fail(where, number, waiting[-1][0], [])
        for gid, (_, partition, keys) in waiting:
            if self.unacked.pop(gid, None) is not None:  # not deleted by a concurrent call meanwhile
                self.collector.delete_bodies(gid, keys, partition)
        self.sink.written()

    async def delete_orphans(self, partitions: set[int] | None = None) -> int:
        """Once the tables of `partitions` (all if None) are recovered: delete the bodies that a crash
        left to groups already done (`GroupCollector.delete_orphans`), and wait for the deletes'
        acknowledgement, so that no group is forgotten while the delete of one of its bodies could
        still be lost (that body would then stay for ever: no tombstone would tell its partition)."""
        deleted = self.collector.delete_orphans(partitions, unacked=self.unacked)
        await asyncio.gather(*self.sink.written())
        return deleted
