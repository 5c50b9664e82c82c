"""`plan_emission`: what finishing one group must write, decided without writing anything.

It sits between `streams.grouping.GroupCollector` (which says a group is due: `complete`,
`timeout_emit` or `timeout_drop`) and the emitter of streams/emission.py, which carries out the
returned `Emission` in the order of the crash protocol (streams/emit.py). Everything the protocol
writes is decided here, from the group, its table entry and the pipeline:

- routing: one Sample per policy and trajectory (the pipeline's `route`), on `samples.<policy>`,
  keyed by its group_id, in the partition murmur2 of that key picks (as Kafka's clients do);
- the intent: the topic-partitions those Samples go to, written to the group table before any of
  them (none when the group makes no Sample, or when a previous worker's intent stands: then the
  emitter reads the targets back first);
- dead letters: a group a stage fails on sends each of its trajectories to `deadletter`, with its
  source offset and the stage's error, and makes no Sample;
- task statistics: the summaries of the `task_stats` stages, `dropped` when the group reaches no
  trainer of one of its policies (a filter dropped it or a stage skipped a policy, a stage failed
  on it, or it was dropped at its timeout), since the feeder then counts it consumed;
- the counters of those decisions.

Every outcome ends with the group marked `done`, and its bodies deleted once that is acknowledged.
Nothing here touches Kafka, Faust or the clock; it runs the pipeline's algorithms, which count into
the pipeline's counters and may keep state (reuse buffers, task summaries).
tests/streams/test_plan.py checks its decisions against hand-derived values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from astraflow.kafka import partition_for
from astraflow.records import Sample, SampleBatch, sample_batches
from streams.api import Group
from streams.grouping import INTENT, Action, GroupCollector, OpenGroup
from streams.pipeline import Pipeline, StageError
from streams.stats import TaskSummary, dropped_summary

#: Samples of a group and policy travel together up to this many encoded bytes a record.
BATCH_BYTES = 1 << 20


@dataclass(frozen=True)
class Routes:
    """Where an emission's records go: the source topic (dead letters name it) and, per policy,
    the samples topic and its partition count."""

    trajectories: str
    samples: Mapping[str, str]  # policy -> full topic name
    partitions: Mapping[str, int]  # policy -> partitions of that topic


class Routed(NamedTuple):
    """One Sample and the topic, partition and key it is produced with."""

    policy: str
    topic: str
    partition: int
    key: bytes  # the group_id the Sample belongs to (a reused copy has its own)
    sample: Sample


class Letter(NamedTuple):
    """One record for `deadletter`: where it was consumed, its bytes, and why it is refused."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    raw: bytes
    reason: str


class Outgoing(NamedTuple):
    """One record of Samples on the wire: a SampleBatch of one group and policy."""

    policy: str
    topic: str
    partition: int
    key: bytes
    batch: SampleBatch


@dataclass(frozen=True)
class Emission:
    """Everything finishing one group writes. `emit` groups go through the protocol's intent and
    acknowledgement waits with the other groups of their batch; `drop` and `fail` groups make no
    Sample and are finished at once (dead letters, then summaries, each acknowledged, then done)."""

    gid: str
    meta: OpenGroup  # its table entry before this emission
    outcome: Literal["emit", "drop", "fail"]
    samples: list[Routed] = field(default_factory=list)
    intent: list[tuple[str, int]] | None = None  # the targets to record before any Sample
    letters: list[Letter] = field(default_factory=list)
    summaries: list[TaskSummary] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # counter increments
    emitted: bool = False  # produced Samples (counted `groups.emitted`, even if a recovery resends none)
    newest: float | None = None  # created_at of its newest trajectory (the end-to-end latency)

    @property
    def recovers(self) -> bool:
        """A previous worker wrote this group's intent and died: read its targets back first."""
        return bool(self.samples) and self.meta["state"] == INTENT


def plan_emission(
    gid: str,
    meta: OpenGroup,
    action: Action,
    group: Group | None,
    *,
    pipeline: Pipeline,
    routes: Routes,
    bodies: list[tuple[str, bytes | None]],
) -> Emission:
    """Decide what finishing group `gid` writes. `group` is the group built from its trajectories
    (None for `timeout_drop`, which needs none); `bodies` are their bytes as consumed, in `meta`
    order (the dead letters of a failed group carry them). Runs the pipeline's algorithms."""
    n = len(meta["ids"])
    if action == "timeout_drop":
        counts = {"groups.timeout_dropped": 1, "stage.group.dropped.timeout": n}
        counts["trajectories.dropped.timeout"] = n
        # it reaches no trainer: the feeder counts it consumed
        summaries = [dropped_summary(gid, meta["task"], meta["env"])] if pipeline.task_stats else []
        return Emission(gid, meta, "drop", summaries=summaries, counts=counts)
    assert group is not None, f"group {gid}: {action} needs its trajectories"
    counts = {"groups.timeout_emitted" if action == "timeout_emit" else "groups.complete": 1}
    counts["stage.group.out"] = n
    try:
        samples = pipeline.to_samples(pipeline.run(group))
    except StageError as exc:
        # a stage (often a plug-in) failed on this group: its trajectories go to deadletter
        offsets = GroupCollector.offsets(meta)
        letters = [
            Letter(routes.trajectories, meta["p"], offset, gid.encode(), raw, f"Trajectory {tid}: {exc}")
            for (tid, raw), offset in zip(bodies, offsets, strict=True)
        ]
        # the group reaches no trainer: its task statistics say so (the feeder counts it consumed)
        summaries = [s | {"dropped": True} for s in _summaries(pipeline)]
        return Emission(gid, meta, "fail", letters=letters, summaries=summaries, counts=counts)
    reached = {s.policy for s in samples if s.group_id == gid}
    whole = set(group.policies) <= reached
    summaries = [s | {"dropped": s["gid"] == gid and not whole} for s in _summaries(pipeline)]
    routed = [route(s, routes) for s in samples]
    return Emission(
        gid,
        meta,
        "emit",
        samples=routed,
        intent=_targets(routed) if routed and meta["state"] != INTENT else None,
        summaries=summaries,
        counts=counts,
        emitted=bool(routed),
        newest=max((t.created_at for t in group.trajectories), default=None),
    )


def _targets(routed: list[Routed]) -> list[tuple[str, int]]:
    return sorted({(r.topic, r.partition) for r in routed})


def _summaries(pipeline: Pipeline) -> list[TaskSummary]:
    return [s for stage in pipeline.task_stats for s in stage.take()]


def route(sample: Sample, routes: Routes) -> Routed:
    """Where a Sample goes: its policy's topic, the partition of its group_id."""
    partition = partition_for(sample.group_id, routes.partitions[sample.policy])
    return Routed(sample.policy, routes.samples[sample.policy], partition, sample.group_id.encode(), sample)


def pack(samples: list[Routed], policies: frozenset[str], halves: bool = False) -> list[Outgoing]:
    """The records Samples go out in: one SampleBatch per group and policy (split at BATCH_BYTES),
    each to the partition its group_id routes to. `halves` (the mid_emit failpoint) packs the first
    and the second half of the Samples apart, so that dying between them leaves some of them on the
    topics, as a group of two policies can."""
    cut = len(samples) // 2
    chunks = [samples[:cut], samples[cut:]] if halves and len(samples) > 1 else [samples]
    out = []
    for chunk in chunks:
        # by group and policy: a reused copy in the chunk has a key, and so a partition, of its own
        where = {(r.key, r.policy): r for r in chunk}
        for batch in sample_batches([r.sample for r in chunk], BATCH_BYTES, policies):
            r = where[(batch.group_id.encode(), batch.policy)]
            out.append(Outgoing(r.policy, r.topic, r.partition, r.key, batch))
    return out
