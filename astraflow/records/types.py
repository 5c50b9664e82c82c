"""The wire records: what travels on each topic (see DESIGN.md, "Wire records"), and `RECORD_TYPES`,
their registry by type name.

Each is a dataclass on `Record` (records/base.py), which validates every record when it is built,
decoded and encoded; what is written here are its fields with their wire kinds and the cross-field
rules of each type (`_check`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from astraflow.errors import RecordError
from astraflow.records.base import Record, wire
from astraflow.records.fields import (
    MAX_KEY_BYTES,
    MAX_TEXT_CHARS,
    NAME,
    SHA256,
    SMALL_ARRAY,
    Array,
    Bool,
    Bytes,
    BytesList,
    Float,
    FloatMap,
    Int,
    IntMap,
    Json,
    Optional,
    Str,
    StrList,
    StrMap,
)

FINISH_REASONS = ("stop", "length", "error", "aborted")
DTYPES = ("bfloat16", "float16", "float32")


def _now() -> float:
    return time.time()


def _empty_i32() -> np.ndarray:
    return np.zeros(0, np.int32)


def _check_policy(field_name: str, name: str, known: frozenset[str] | None) -> None:
    if known is not None and name not in known:
        raise RecordError(field_name, f"unknown policy {name!r}; known: {', '.join(sorted(known))}")


@dataclass(eq=False)
class Task(Record):
    """A unit of rollout work: one prompt (or environment seed) to run `group_size` times."""

    TYPE: ClassVar[str] = "Task"

    task_id: str = wire(Str())
    env: str = wire(NAME)
    roles: dict[str, str] = wire(StrMap())  # role -> policy
    group_size: int = wire(Int(min=1, max=4096), default=1)
    prompt: str | None = wire(Optional(Str(max_chars=MAX_TEXT_CHARS, nonempty=False)), default=None)
    seed: int | None = wire(Optional(Int(min=0, max=2**63 - 1)), default=None)
    payload: Any = wire(Json(), default_factory=dict)
    attempt: int = wire(Int(min=0, max=1_000_000), default=0)
    created_at: float = wire(Float(min=0), default_factory=_now)
    min_versions: dict[str, int] = wire(IntMap(min=0, max=2**31 - 1), default_factory=dict)
    """Per policy, the newest weight version the feeder had seen when it admitted the task: workers
    roll the task out with at least these weights, so the staleness bound admission keeps holds even
    when the feeder hears of a version before the workers have loaded it."""

    def _check(self, known_policies: frozenset[str] | None) -> None:
        for role, policy in self.roles.items():
            _check_policy(f"roles.{role}", policy, known_policies)
        for policy in self.min_versions:
            _check_policy(f"min_versions.{policy}", policy, known_policies)

    @property
    def group_id(self) -> str:
        return group_id(self.task_id, self.attempt)


def group_id(task_id: str, attempt: int) -> str:
    """Deterministic id of the group of trajectories of one task attempt."""
    return f"{task_id}#{attempt}"


def traj_id(task_id: str, attempt: int, index: int) -> str:
    """Deterministic trajectory id: a re-run of the same task attempt produces the same ids."""
    return f"{task_id}#{attempt}#{index}"


@dataclass(eq=False)
class Trajectory(Record):
    """One episode: the whole token stream with, per token, its owner policy, behaviour
    log-probability and the weight version that generated it."""

    TYPE: ClassVar[str] = "Trajectory"
    TOKEN_FIELDS: ClassVar[tuple[str, ...]] = ("tokens", "owner", "logprobs", "versions")

    traj_id: str = wire(Str())
    group_id: str = wire(Str())
    task_id: str = wire(Str())
    env: str = wire(NAME)
    policies: list[str] = wire(StrList())
    tokens: np.ndarray = wire(Array("int32", min=0), default_factory=_empty_i32)
    owner: np.ndarray = wire(Array("int8", min=-1), default_factory=lambda: np.zeros(0, np.int8))
    logprobs: np.ndarray = wire(
        Array("float32", finite=True, max=0.0), default_factory=lambda: np.zeros(0, np.float32)
    )
    versions: np.ndarray = wire(Array("int32", min=-1), default_factory=_empty_i32)
    rewards: dict[str, float] = wire(FloatMap(key=NAME), default_factory=dict)
    finish_reason: str = wire(Str(choices=FINISH_REASONS), default="stop")
    error: str | None = wire(Optional(Str(max_chars=4096)), default=None)
    group_size: int = wire(Int(min=1, max=4096), default=1)
    sample_index: int = wire(Int(min=0, max=4095), default=0)
    attempt: int = wire(Int(min=0, max=1_000_000), default=0)
    worker_id: str = wire(Str(), default="unknown")
    region: str = wire(Str(), default="local")
    timings: dict[str, float] = wire(FloatMap(min=0), default_factory=dict)
    created_at: float = wire(Float(min=0), default_factory=_now)

    def _check(self, known_policies: frozenset[str] | None) -> None:
        for i, name in enumerate(self.policies):
            _check_policy(f"policies[{i}]", name, known_policies)
        if self.owner.size <= SMALL_ARRAY:  # as Python numbers: numpy's per-call cost is most of the check
            owners, versions = self.owner.tolist(), self.versions.tolist()
            top = max(owners, default=-1)
            unversioned = any(v < 0 for o, v in zip(owners, versions, strict=True) if o >= 0)
        else:
            top = int(self.owner.max())
            unversioned = bool(np.any(self.versions[self.owner >= 0] < 0))
        if top >= len(self.policies):
            raise RecordError("owner", f"owner index {top} but only {len(self.policies)} policies")
        if set(self.rewards) != set(self.policies):
            raise RecordError(
                "rewards", f"needs exactly one reward per policy {self.policies}, got {sorted(self.rewards)}"
            )
        if self.sample_index >= self.group_size:
            raise RecordError(
                "sample_index", f"{self.sample_index} is not below group_size {self.group_size}"
            )
        if unversioned:
            raise RecordError("versions", "every generated token needs a weight version >= 0")

    def policy_mask(self, policy: str) -> np.ndarray:
        """Boolean mask of the tokens this policy generated."""
        return self.owner == self.policies.index(policy)

    def min_version(self, policy: str | None = None) -> int:
        """Oldest weight version among the generated tokens (of one policy, or of all); -1 if none."""
        mask = self.owner >= 0 if policy is None else self.policy_mask(policy)
        return int(self.versions[mask].min()) if mask.any() else -1


@dataclass(eq=False)
class TrajectoryBatch(Record):
    """Trajectories of one group, sent together: what a worker writes to `trajectories` when a task's
    episodes have ended (one record per group instead of one per episode: the streams worker's cost
    is per record, ~2 ms each, in Faust's event path; a straggler more than 2 s behind the others goes
    in a record of its own, `workers.batching.BATCH_WAIT_S`). `items` are encoded Trajectory records, each
    checked on its own by the consumer, so one bad trajectory is dead-lettered alone. A group too big
    for one record is split into several (`astraflow.records.batches`)."""

    TYPE: ClassVar[str] = "TrajectoryBatch"

    group_id: str = wire(Str())
    items: list[bytes] = wire(BytesList())


@dataclass(eq=False)
class Sample(Record):
    """One policy's view of a trajectory, ready to train: loss mask on that policy's tokens and
    the advantages computed by the streams stage."""

    TYPE: ClassVar[str] = "Sample"
    TOKEN_FIELDS: ClassVar[tuple[str, ...]] = ("tokens", "loss_mask", "logprobs", "versions", "advantages")

    policy: str = wire(NAME)
    traj_id: str = wire(Str())
    group_id: str = wire(Str())
    task_id: str = wire(Str())
    env: str = wire(NAME)
    tokens: np.ndarray = wire(Array("int32", min=0), default_factory=_empty_i32)
    loss_mask: np.ndarray = wire(Array("uint8", min=0, max=1), default_factory=lambda: np.zeros(0, np.uint8))
    logprobs: np.ndarray = wire(
        Array("float32", finite=True, max=0.0), default_factory=lambda: np.zeros(0, np.float32)
    )
    versions: np.ndarray = wire(Array("int32", min=-1), default_factory=_empty_i32)
    advantages: np.ndarray = wire(
        Array("float32", finite=True), default_factory=lambda: np.zeros(0, np.float32)
    )
    reward: float = wire(Float(), default=0.0)
    group_size: int = wire(Int(min=1, max=4096), default=1)
    group_samples: int = wire(Int(min=1, max=4096), default=1)  # samples of this group sent to this policy
    group_mean: float = wire(Float(), default=0.0)
    group_std: float = wire(Float(min=0), default=0.0)
    finish_reason: str = wire(Str(choices=FINISH_REASONS), default="stop")
    attempt: int = wire(Int(min=0, max=1_000_000), default=0)
    replayed: int = wire(Int(min=0, max=1_000_000), default=0)
    created_at: float = wire(Float(min=0), default_factory=_now)

    def _check(self, known_policies: frozenset[str] | None) -> None:
        _check_policy("policy", self.policy, known_policies)

    def min_version(self) -> int:
        mask = self.loss_mask.astype(bool)
        return int(self.versions[mask].min()) if mask.any() else -1


@dataclass(eq=False)
class SampleBatch(Record):
    """One policy's Samples of one group, sent together: what streams writes to `samples.<policy>`
    (one record per group and policy instead of one per Sample: each record costs the streams
    worker a pass through Faust's produce path and the trainer a message). `items` are encoded
    Sample records, each checked on its own by the trainer, so one bad Sample is dead-lettered
    alone. A group too big for one record is split into several (`astraflow.records.sample_batches`)."""

    TYPE: ClassVar[str] = "SampleBatch"

    group_id: str = wire(Str())
    policy: str = wire(NAME)
    items: list[bytes] = wire(BytesList())

    def _check(self, known_policies: frozenset[str] | None) -> None:
        _check_policy("policy", self.policy, known_policies)


@dataclass(eq=False)
class WeightVersion(Record):
    """A new version of one policy's weights in the weight store. Weights never travel in Kafka:
    only their URIs and checksums do."""

    TYPE: ClassVar[str] = "WeightVersion"

    policy: str = wire(NAME)
    version: int = wire(Int(min=0))
    step: int = wire(Int(min=0), default=0)
    snapshot_version: int = wire(Int(min=0), default=0)
    snapshot_uri: str = wire(Str(max_chars=4096), default="")
    snapshot_sha256: str = wire(SHA256, default="0" * 64)
    snapshot_bytes: int = wire(Int(min=0), default=0)
    delta_uri: str | None = wire(Optional(Str(max_chars=4096)), default=None)
    delta_base: int | None = wire(Optional(Int(min=0)), default=None)
    delta_sha256: str | None = wire(Optional(SHA256), default=None)
    delta_bytes: int | None = wire(Optional(Int(min=0)), default=None)
    changed_fraction: float | None = wire(Optional(Float(min=0.0, max=1.0)), default=None)
    dtype: str = wire(Str(choices=DTYPES), default="bfloat16")
    created_at: float = wire(Float(min=0), default_factory=_now)
    groups_consumed: int = wire(Int(min=0), default=0)
    """Groups the trainer has taken from its samples topic so far (trained, or discarded as stale):
    the feeder's admission control counts them as consumed."""
    mac: str | None = wire(Optional(SHA256), default=None)
    """HMAC-SHA256 of the rest of the event under the run's secret (astraflow.weights.auth), so a
    reader can tell the trainer's events from forged ones; None where the run has no secret."""

    def _check(self, known_policies: frozenset[str] | None) -> None:
        _check_policy("policy", self.policy, known_policies)
        if self.snapshot_version > self.version:
            raise RecordError("snapshot_version", f"{self.snapshot_version} is after version {self.version}")
        has_delta = [self.delta_uri is not None, self.delta_base is not None, self.delta_sha256 is not None]
        if any(has_delta) and not all(has_delta):
            raise RecordError("delta_uri", "delta_uri, delta_base and delta_sha256 go together")
        if self.delta_base is not None and self.delta_base >= self.version:
            raise RecordError("delta_base", f"{self.delta_base} is not before version {self.version}")


@dataclass(eq=False)
class TaskStats(Record):
    """Running statistics of one task, for selective rollout and curricula."""

    TYPE: ClassVar[str] = "TaskStats"

    task_id: str = wire(Str())
    env: str = wire(NAME)
    groups: int = wire(Int(min=0), default=0)
    samples: int = wire(Int(min=0), default=0)
    mean_reward: float = wire(Float(), default=0.0)
    success_rate: float = wire(Float(min=0.0, max=1.0), default=0.0)
    zero_variance_groups: int = wire(Int(min=0), default=0)
    dropped_groups: int = wire(Int(min=0), default=0)
    """Groups of this task that reach no trainer of some policy (a filter or a stage dropped them):
    the feeder counts them as consumed."""
    last_version: int = wire(Int(min=-1), default=-1)
    updated_at: float = wire(Float(min=0), default_factory=_now)


@dataclass(eq=False)
class Metric(Record):
    """A set of named measurements from one component instance at one time."""

    TYPE: ClassVar[str] = "Metric"

    component: str = wire(NAME)
    id: str = wire(Str())
    values: dict[str, float] = wire(FloatMap(nonempty=True))
    region: str = wire(Str(), default="local")
    step: int = wire(Int(min=-1), default=-1)
    time: float = wire(Float(min=0), default_factory=_now)


@dataclass(eq=False)
class DeadLetter(Record):
    """A record a component could not use, with where it came from and why."""

    TYPE: ClassVar[str] = "DeadLetter"

    source_topic: str = wire(Str())
    partition: int = wire(Int(min=-1))
    offset: int = wire(Int(min=-1))
    error: str = wire(Str(max_chars=8192))
    component: str = wire(Str())
    raw: bytes = wire(Bytes(), default=b"")
    key: bytes | None = wire(Optional(Bytes(max_bytes=MAX_KEY_BYTES)), default=None)
    truncated: bool = wire(Bool(), default=False)
    """`raw` or `key` holds only the first bytes of the record's (astraflow.deadletters.DeadLetters)."""
    time: float = wire(Float(min=0), default_factory=_now)


@dataclass(eq=False)
class Demonstration(Record):
    """One scripted expert episode for a policy's supervised warm-up (`trainer.warmup`): the feeder
    plays the environment's expert and writes `count` of them to `demonstrations.<policy>`; the
    trainer reads them back before its first RL step. `source` names what the set was played from
    (`Recipe.demonstration_source`), so a trainer never learns another recipe's demonstrations."""

    TYPE: ClassVar[str] = "Demonstration"

    policy: str = wire(NAME)
    source: str = wire(Str())
    index: int = wire(Int(min=0))
    count: int = wire(Int(min=1))
    tokens: np.ndarray = wire(Array("int32", min=0), default_factory=_empty_i32)
    loss_mask: np.ndarray = wire(Array("uint8", min=0, max=1), default_factory=lambda: np.zeros(0, np.uint8))
    """1 on the expert's tokens (what the warm-up learns), 0 on <bos>, prompt and observations."""
    reward: float = wire(Float(), default=0.0)
    """The environment's reward for the expert's episode."""

    def _check(self, known_policies: frozenset[str] | None) -> None:
        _check_policy("policy", self.policy, known_policies)
        if self.index >= self.count:
            raise RecordError("index", f"{self.index} is not below count {self.count}")
        if len(self.loss_mask) != len(self.tokens):
            raise RecordError("loss_mask", f"has {len(self.loss_mask)} entries for {len(self.tokens)} tokens")


RECORD_TYPES: dict[str, type[Record]] = {
    cls.TYPE: cls
    for cls in (
        Task,
        Trajectory,
        TrajectoryBatch,
        Sample,
        SampleBatch,
        WeightVersion,
        TaskStats,
        Metric,
        DeadLetter,
        Demonstration,
    )
}
