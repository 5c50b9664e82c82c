"""Emission, the part of StreamsRuntime (streams/runtime.py) that turns complete groups into Samples.

An emitter task drains a queue of groups in batches, everything queued while one batch is emitted
forming the next: it runs the group algorithms, routes, and produces the Samples with the intent
protocol of streams/emit.py, so a crash at any point neither loses nor duplicates a Sample. A batch
pays the protocol's two awaited round trips (intents durable, then Samples acknowledged) once for
all its groups; one group at a time, the groups of a training step queued behind each other's
round trips.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from astraflow.records import SampleBatch, Trajectory, decode, encode, sample_batches
from streams.api import Group
from streams.emit import partition_for, read_back
from streams.grouping import DONE, INTENT, OpenGroup
from streams.pipeline import StageError
from streams.stats import TaskSummary, dropped_summary

log = logging.getLogger(__name__)
#: Samples of a group and policy travel together up to this many encoded bytes a record.
BATCH_BYTES = 1 << 20


def failpoint_from_env() -> tuple[str, int] | None:
    """Fault injection for the crash tests: ASTRAFLOW_STREAMS_FAILPOINT=mid_emit:N (SIGKILL after the
    first half of the N-th emitted group's Samples are acknowledged) or after_emit:N (after all the Samples
    of the N-th group's batch are, before any group of the batch is marked done)."""
    spec = os.environ.get("ASTRAFLOW_STREAMS_FAILPOINT", "")
    where, _, n = spec.partition(":")
    return (where, int(n)) if where in ("mid_emit", "after_emit") and n.isdigit() else None


@dataclass
class _Plan:
    """One group of an emission batch: what its algorithms made of it, before anything is sent."""

    gid: str
    meta: OpenGroup  # as it was before this emission's intent
    group: Group
    records: list[tuple[str, int, Any]]  # (policy, partition, Sample)
    summaries: list[TaskSummary]
    emitted: bool
    number: int = 0  # its place among the emissions that produced Samples (the failpoints count them)


class Emitter:
    """The emission half of StreamsRuntime (a mixin: it uses the runtime's collector, pipeline,
    topics, counters, producer and dead letters)."""

    app: Any
    collector: Any
    pipeline: Any
    topics: Any
    settings: Any
    policies: frozenset[str]
    counters: Any
    dead: Any
    publisher: Any
    cache: Any
    arrived: Any
    queue: dict[str, str]
    emitting: set[str]
    _wake: asyncio.Event
    failpoint: tuple[str, int] | None
    emissions: int

    def written(self) -> list[Any]:
        raise NotImplementedError

    async def deadletter(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        raw: bytes,
        error: str,
        wait: bool = True,
    ) -> None:
        """Dead-letter one record and wait for the broker's ack: its offset may be committed next.
        `wait=False`: the caller waits once (`flush_dead`) for several, before its offset is done."""
        self.dead.publish(topic, partition, offset, key, raw, error)
        self.counters.inc("trajectories.deadlettered")
        self.counters.inc("deadletter.count")
        if wait:
            await self.flush_dead()

    async def flush_dead(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.publisher.flush, 60.0)

    def _group(self, gid: str, meta: OpenGroup, complete: bool) -> Group | None:
        trajs = []
        for tid, raw in self.collector.bodies_of(gid):
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

    def enqueue(self, gid: str, action: str) -> None:
        """Queue a group for the emitter (a complete group is emitted as complete, even if a
        timeout queued it first)."""
        if gid in self.emitting:
            return
        if action == "complete" or gid not in self.queue:
            self.queue[gid] = action
        self._wake.set()

    async def emitter(self) -> None:
        """Emit what is queued, in batches: everything queued while a batch is emitted is the next."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self.queue = list(self.queue.items()), {}
            if not batch:
                continue
            self.emitting.update(gid for gid, _ in batch)
            try:
                await self.emit(batch)
            finally:
                self.emitting.difference_update(gid for gid, _ in batch)

    async def emit(self, batch: list[tuple[str, str]]) -> None:
        """Finish the groups of `batch` ((gid, action) pairs): the intents of all of them are made
        durable together, then all their Samples are produced and acknowledged together."""
        plans = [plan for gid, action in batch if (plan := await self._plan(gid, action)) is not None]
        fresh = [p for p in plans if p.records and p.meta["state"] != INTENT]
        now = time.time()
        for p in fresh:
            targets = sorted(
                {(self.topics.samples[pol].get_topic_name(), part) for pol, part, _ in p.records}
            )
            self.collector.mark_intent(p.gid, now, targets)
        intents = self.written()  # taken before any await: other writes may follow meanwhile
        await self._recover([p for p in plans if p.records and p.meta["state"] == INTENT])
        if fresh:
            await self.send_now()
            await asyncio.gather(*intents)  # the intents are durable before any Sample exists
        futures: list[Any] = []
        for p in plans:
            self.emissions += bool(p.records)
            p.number = self.emissions
            outgoing = self._records_of(p)
            for i, (policy, part, batch) in enumerate(outgoing):
                if i == len(outgoing) // 2:
                    await self._maybe_fail("mid_emit", p.number, p.gid, futures)
                topic = self.topics.samples[policy]
                futures.append(
                    await topic.send(
                        key=batch.group_id.encode(), value=encode(batch, self.policies), partition=part
                    )
                )
                self.counters.inc(f"samples.out.{policy}", len(batch.items))
            futures += await self._send_summaries(p.summaries, wait=False)
        await self.send_now()
        await asyncio.gather(*futures)
        done = time.time()
        for p in plans:
            if p.records:
                await self._maybe_fail("after_emit", p.number, p.gid, futures)
            if p.emitted:
                self.counters.inc("groups.emitted")
                if p.gid in self.arrived:
                    self.counters.observe("latency.emit_ms", (done - self.arrived[p.gid]) * 1000.0)
                newest = max((t.created_at for t in p.group.trajectories), default=done)
                self.counters.observe("latency.e2e_ms", max(0.0, done - newest) * 1000.0)
            await self._finish(p.gid, p.meta)

    async def _plan(self, gid: str, action: str) -> _Plan | None:
        """Run the algorithms of one group. A group that ends here (dropped at its timeout, or
        failed by a stage) is finished here; None also when it is gone, done, or waits for bodies."""
        c = self.counters
        meta = self.collector.meta(gid)
        if meta is None or meta["state"] == DONE:
            return None
        n = len(meta["ids"])
        if action == "timeout_drop":
            c.inc("groups.timeout_dropped")
            c.inc("stage.group.dropped.timeout", n)
            c.inc("trajectories.dropped.timeout", n)
            if self.pipeline.task_stats:  # it reaches no trainer: the feeder counts it consumed
                await self._send_summaries([dropped_summary(gid, meta["task"], meta["env"])])
            await self._finish(gid, meta)
            return None
        group = self._group(gid, meta, complete=action == "complete")
        if group is None:
            c.inc("groups.waiting_for_bodies")
            return None
        c.inc("groups.timeout_emitted" if action == "timeout_emit" else "groups.complete")
        c.inc("stage.group.out", n)
        try:
            outputs = self.pipeline.run(group)
            samples = self.pipeline.to_samples(outputs)
        except StageError as exc:
            # a stage (often a plug-in) failed on this group: its trajectories go to deadletter
            offsets = self.collector.offsets(meta)
            for (tid, raw), offset in zip(self.collector.bodies_of(gid), offsets, strict=True):
                await self.deadletter(
                    self.topics.trajectories,
                    meta["p"],
                    offset,
                    gid.encode(),
                    raw,
                    f"Trajectory {tid}: {exc}",
                    wait=False,
                )
            await self.flush_dead()  # one wait for the group's dead letters
            # the group reaches no trainer: its task statistics say so (the feeder counts it consumed)
            await self._send_summaries(
                [s | {"dropped": True} for stage in self.pipeline.task_stats for s in stage.take()]
            )
            await self._finish(gid, meta)
            return None
        summaries = [s for stage in self.pipeline.task_stats for s in stage.take()]
        reached = {s.policy for s in samples if s.group_id == gid}
        for (
            summary
        ) in summaries:  # a group that reaches no trainer of some policy: the feeder counts it consumed
            summary["dropped"] = summary["gid"] == gid and not set(group.policies) <= reached
        records = [
            (s.policy, partition_for(s.group_id, self.topics.sample_partitions[s.policy]), s) for s in samples
        ]
        return _Plan(gid, meta, group, records, summaries, emitted=bool(records))

    def _records_of(self, plan: _Plan) -> list[tuple[str, int, SampleBatch]]:
        """The records a plan's Samples go out in: one SampleBatch per policy (split at
        BATCH_BYTES). The mid_emit failpoint's group sends its Samples in two halves, so that
        dying between them leaves some of them on the topics, as a group of two policies can."""
        records = plan.records
        halves = self.failpoint == ("mid_emit", plan.number) and len(records) > 1
        chunks = [records[: len(records) // 2], records[len(records) // 2 :]] if halves else [records]
        out = []
        for chunk in chunks:
            parts = {policy: part for policy, part, _ in chunk}
            out += [
                (b.policy, parts[b.policy], b)
                for b in sample_batches([s for _, _, s in chunk], BATCH_BYTES, self.policies)
            ]
        return out

    async def send_now(self) -> None:
        """End the producer's linger for what was just sent (see `_IdempotentProducer.send_now`)."""
        send_now = getattr(self.app.producer, "send_now", None)
        if send_now is not None:
            await send_now()

    async def _send_summaries(self, summaries: list[TaskSummary], wait: bool = True) -> list:
        futures = []
        if self.topics.task_updates is not None:
            for summary in summaries:
                futures.append(
                    await self.topics.task_updates.send(key=summary["task"].encode(), value=summary)
                )
        if wait:
            await asyncio.gather(*futures)
        return futures

    async def _maybe_fail(self, where: str, number: int, gid: str, futures: list) -> None:
        if self.failpoint == (where, number):
            await asyncio.gather(*futures)
            log.warning("failpoint %s:%d (group %s): SIGKILL", where, number, gid)
            os.kill(os.getpid(), signal.SIGKILL)

    async def _recover(self, plans: list[_Plan]) -> None:
        """A previous worker died while emitting these groups: keep in each plan only the Samples
        that are not on the topics (one read-back for all of them)."""
        if not plans:
            return
        name = {pol: topic.get_topic_name() for pol, topic in self.topics.samples.items()}
        targets = {(t, part) for p in plans for t, part in p.meta.get("targets", [])}
        targets |= {(name[pol], part) for p in plans for pol, part, _ in p.records}
        keys = {s.group_id for p in plans for _, _, s in p.records}
        since = min(p.meta["at"] for p in plans)
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(None, read_back, self.settings, sorted(targets), keys, since)
        for p in plans:
            missing = [r for r in p.records if (name[r[0]], r[2].traj_id) not in found]
            self.counters.inc("groups.recovered")
            self.counters.inc("samples.recovered", len(p.records) - len(missing))
            log.warning(
                "group %s: recovered an interrupted emission; %d of %d Samples were already on the topics",
                p.gid,
                len(p.records) - len(missing),
                len(p.records),
            )
            p.records = missing

    async def _finish(self, gid: str, meta: OpenGroup) -> None:
        for tid in meta["ids"]:
            self.cache.pop(tid, None)
        self.arrived.pop(gid, None)
        self.collector.mark_done(gid, time.time())
        self.written()
