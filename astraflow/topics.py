"""The topic spec (topics.yaml) and its convergence onto a cluster (`astraflow topics apply`).

`load_spec` validates the file (an unknown or malformed key is a ConfigError naming it);
`expand` turns templates such as `samples.{policy}` into concrete topics; `apply` creates what is
missing, grows partitions and converges configs. Running it twice changes nothing.
"""

from __future__ import annotations

import os
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from astraflow.config.base import StrictModel, read_yaml, validate_model
from astraflow.config.kafka import KafkaSettings
from astraflow.errors import ConfigError
from astraflow.records import RECORD_TYPES


def default_spec_path() -> Path:
    """topics.yaml: $ASTRAFLOW_TOPICS_FILE, else the repository's copy, else ./topics.yaml."""
    env = os.environ.get("ASTRAFLOW_TOPICS_FILE")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parent.parent / "topics.yaml"
    return repo if repo.exists() else Path("topics.yaml")


DEFAULT_SPEC = default_spec_path()
TOPIC_RE = re.compile(r"^[A-Za-z0-9._\-{}]{1,200}$")
PLACEHOLDERS = {"policy"}

# The base names of the topics of topics.yaml: code spells a topic only through these (prefixed by
# `KafkaSettings.topic` with the run's namespace); tests/foundation/test_topics.py checks that they
# and the file name the same topics.
TASKS = "tasks"
TRAJECTORIES = "trajectories"
SAMPLES = "samples.{policy}"
WEIGHTS = "weights"
TASK_STATS = "task-stats"
METRICS = "metrics"
DEADLETTER = "deadletter"
DEMONSTRATIONS = "demonstrations.{policy}"
BASE_NAMES = (TASKS, TRAJECTORIES, SAMPLES, WEIGHTS, TASK_STATS, METRICS, DEADLETTER, DEMONSTRATIONS)


def samples(policy: str) -> str:
    """The base name of a policy's samples topic."""
    return SAMPLES.format(policy=policy)


def demonstrations(policy: str) -> str:
    """The base name of a policy's demonstrations topic (`trainer.warmup`)."""
    return DEMONSTRATIONS.format(policy=policy)


def _stringify_configs(v: Any) -> Any:
    """Kafka topic configs are strings; YAML gives numbers and booleans too."""
    if isinstance(v, dict):
        return {k: str(x) for k, x in v.items()}
    return v


class TopicDefaults(StrictModel):
    partitions: int = Field(default=1, ge=1, le=10_000)
    """Number of partitions (can grow later, never shrink)."""
    replication: int = Field(default=1, ge=1, le=16)
    """Replication factor."""
    cleanup: Literal["delete", "compact", "compact,delete"] = "delete"
    """Kafka cleanup.policy."""
    retention_ms: int = Field(default=604_800_000, ge=-1)
    """Kafka retention.ms (-1: forever)."""
    max_message_bytes: int = Field(default=1 << 20, ge=1024, le=256 << 20)
    """Kafka max.message.bytes."""


class TopicEntry(StrictModel):
    record: str
    """Record type carried (Task, Trajectory, ...)."""
    partitions: int | None = Field(default=None, ge=1, le=10_000)
    replication: int | None = Field(default=None, ge=1, le=16)
    cleanup: Literal["delete", "compact", "compact,delete"] | None = None
    retention_ms: int | None = Field(default=None, ge=-1)
    max_message_bytes: int | None = Field(default=None, ge=1024, le=256 << 20)
    configs: dict[str, str] = Field(default_factory=dict)
    """Further Kafka topic configs, verbatim."""

    @field_validator("record")
    @classmethod
    def _known_record(cls, v: str) -> str:
        if v not in RECORD_TYPES:
            raise ValueError(f"unknown record type {v!r}; known: {', '.join(RECORD_TYPES)}")
        return v

    @field_validator("configs", mode="before")
    @classmethod
    def _stringify(cls, v: Any) -> Any:
        return _stringify_configs(v)


class TopicProfile(StrictModel):
    """Settings laid over every topic for one kind of cluster (`apply --profile NAME`), e.g. a
    replicated cluster: the same topics, each with more copies."""

    replication: int | None = Field(default=None, ge=1, le=16)
    """Replication factor of every topic (overrides the defaults and each topic's own)."""
    min_insync_replicas: int | None = Field(default=None, ge=1, le=16)
    """Kafka min.insync.replicas of every topic: with acks=all (every AstraFlow producer), a write
    succeeds only once this many replicas have it, so losing fewer than that many brokers loses
    no acknowledged record. Must be at most the replication."""
    configs: dict[str, str] = Field(default_factory=dict)
    """Further Kafka topic configs for every topic, verbatim."""

    @field_validator("configs", mode="before")
    @classmethod
    def _stringify(cls, v: Any) -> Any:
        return _stringify_configs(v)


class TopicsFile(StrictModel):
    version: Literal[1] = 1
    defaults: TopicDefaults = TopicDefaults()
    profiles: dict[str, TopicProfile] = Field(default_factory=dict)
    """Named overlays chosen with `--profile` (or $ASTRAFLOW_TOPICS_PROFILE)."""
    topics: dict[str, TopicEntry]


@dataclass(frozen=True)
class TopicSpec:
    """One concrete topic, as it should exist on the cluster."""

    name: str
    base: str  # the name in topics.yaml, e.g. "samples.{policy}"
    record: str
    partitions: int
    replication: int
    configs: dict[str, str] = field(default_factory=dict)


def load_spec(path: str | Path = DEFAULT_SPEC) -> TopicsFile:
    """Read and validate topics.yaml."""
    source = str(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    spec = validate_model(TopicsFile, data, source)
    for name in spec.topics:
        if not TOPIC_RE.match(name):
            raise ConfigError(f"{source}: topics.{name}: not a legal topic name")
        used = {f for _, f, _, _ in string.Formatter().parse(name) if f is not None}
        unknown = used - PLACEHOLDERS
        if unknown:
            raise ConfigError(
                f"{source}: topics.{name}: unknown placeholder {{{sorted(unknown)[0]}}}; known: {{policy}}"
            )
    return spec


def profile_of(spec: TopicsFile, name: str | None) -> TopicProfile:
    """The named profile; with no name, $ASTRAFLOW_TOPICS_PROFILE's (so `astraflow run` and every
    component apply the same one), else none."""
    name = name or os.environ.get("ASTRAFLOW_TOPICS_PROFILE") or None
    if name is None:
        return TopicProfile()
    if name not in spec.profiles:
        known = ", ".join(sorted(spec.profiles)) or "none"
        raise ConfigError(f"unknown topic profile {name!r}; topics.yaml defines: {known}")
    return spec.profiles[name]


def expand(
    spec: TopicsFile,
    policies: list[str] | None,
    settings: KafkaSettings | None = None,
    profile: str | None = None,
) -> list[TopicSpec]:
    """Concrete topics for the given policies, with the namespace prefix of `settings` and the
    overlay of `profile` (see `profile_of`)."""
    settings = settings or KafkaSettings()
    over = profile_of(spec, profile)
    out: list[TopicSpec] = []
    for base, entry in spec.topics.items():
        if "{policy}" in base:
            if not policies:
                raise ConfigError(
                    f"topic template {base!r} needs policies: pass --policies a,b or --recipe R"
                )
            names = [base.format(policy=p) for p in policies]
        else:
            names = [base]
        d = spec.defaults
        configs = {
            "cleanup.policy": entry.cleanup or d.cleanup,
            "retention.ms": str(entry.retention_ms if entry.retention_ms is not None else d.retention_ms),
            "max.message.bytes": str(entry.max_message_bytes or d.max_message_bytes),
            **entry.configs,
            **over.configs,
        }
        replication = over.replication or entry.replication or d.replication
        if over.min_insync_replicas is not None:
            if over.min_insync_replicas > replication:
                raise ConfigError(
                    f"topic {base}: min_insync_replicas {over.min_insync_replicas} exceeds its "
                    f"replication {replication}: every acks=all write would be refused"
                )
            configs["min.insync.replicas"] = str(over.min_insync_replicas)
        for name in names:
            out.append(
                TopicSpec(
                    name=settings.topic(name),
                    base=base,
                    record=entry.record,
                    partitions=entry.partitions or d.partitions,
                    replication=replication,
                    configs=configs,
                )
            )
    return out


def find(specs: list[TopicSpec], base: str) -> TopicSpec:
    for s in specs:
        if s.base == base or s.name == base:
            return s
    raise ConfigError(f"no topic {base!r} in the topic spec")


@dataclass
class ApplyReport:
    created: list[str] = field(default_factory=list)
    grown: list[tuple[str, int, int]] = field(default_factory=list)
    reconfigured: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.grown or self.reconfigured)


def apply(admin: Any, specs: list[TopicSpec], timeout: float = 30.0) -> ApplyReport:
    """Converge the cluster behind `admin` (a confluent_kafka AdminClient) to `specs`."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewPartitions,
        NewTopic,
    )

    report = ApplyReport()
    metadata = admin.list_topics(timeout=timeout)
    brokers = len(metadata.brokers)
    existing = metadata.topics
    for s in specs:
        if s.replication > brokers:
            raise ConfigError(
                f"topic {s.name}: replication {s.replication} exceeds the {brokers} broker(s) of this cluster"
            )

    missing = [s for s in specs if s.name not in existing]
    if missing:
        futures = admin.create_topics(
            [
                NewTopic(
                    s.name, num_partitions=s.partitions, replication_factor=s.replication, config=s.configs
                )
                for s in missing
            ],
            operation_timeout=timeout,
            request_timeout=timeout,
        )
        for name, fut in futures.items():
            try:
                fut.result()
                report.created.append(name)
            except KafkaException as exc:
                if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                    raise
                report.unchanged.append(name)

    present = [s for s in specs if s.name in existing]
    grow = [s for s in present if len(existing[s.name].partitions) < s.partitions]
    for s in present:
        copies = min((len(p.replicas) for p in existing[s.name].partitions.values()), default=s.replication)
        if copies != s.replication:
            report.warnings.append(
                f"{s.name} has {copies} replica(s), not the {s.replication} of the spec "
                f"(apply does not move replicas: use kafka-reassign-partitions)"
            )
        have = len(existing[s.name].partitions)
        if have > s.partitions:
            report.warnings.append(
                f"{s.name} has {have} partitions, more than the {s.partitions} of the "
                f"spec (Kafka cannot shrink a topic)"
            )
    if grow:
        futures = admin.create_partitions(
            [NewPartitions(s.name, s.partitions) for s in grow],
            operation_timeout=timeout,
            request_timeout=timeout,
        )
        for s in grow:
            futures[s.name].result()
            report.grown.append((s.name, len(existing[s.name].partitions), s.partitions))

    if present:
        resources = [ConfigResource(ConfigResource.Type.TOPIC, s.name) for s in present]
        described = admin.describe_configs(resources, request_timeout=timeout)
        current: dict[str, dict[str, str]] = {}
        for res, fut in described.items():
            current[res.name] = {k: v.value for k, v in fut.result().items()}
        to_alter = []
        for s in present:
            diff = {k: v for k, v in s.configs.items() if current[s.name].get(k) != v}
            if diff:
                entries = [
                    ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in diff.items()
                ]
                to_alter.append(
                    ConfigResource(ConfigResource.Type.TOPIC, s.name, incremental_configs=entries)
                )
                report.reconfigured.append((s.name, diff))
        if to_alter:
            for fut in admin.incremental_alter_configs(to_alter, request_timeout=timeout).values():
                fut.result()
            _await_configs(admin, dict(report.reconfigured), timeout)
    changed = {n for n, *_ in report.grown} | {n for n, _ in report.reconfigured}
    report.unchanged.extend(s.name for s in present if s.name not in changed)
    if report.created or report.grown:
        _await_metadata(admin, specs, timeout)
    return report


def _await_configs(admin: Any, wanted: dict[str, dict[str, str]], timeout: float) -> None:
    """Wait until `describe_configs` shows the values just set: the broker acknowledges an alter
    before every read path sees it, and a second `apply` right after must find nothing to change."""
    import time

    from confluent_kafka.admin import ConfigResource

    deadline = time.monotonic() + timeout
    while True:
        described = admin.describe_configs(
            [ConfigResource(ConfigResource.Type.TOPIC, n) for n in wanted], request_timeout=timeout
        )
        lagging = []
        for res, fut in described.items():
            have = {k: v.value for k, v in fut.result().items()}
            if any(have.get(k) != v for k, v in wanted[res.name].items()):
                lagging.append(res.name)
        if not lagging:
            return
        if time.monotonic() > deadline:
            raise ConfigError(f"topic configs not applied after {timeout:.0f}s: {', '.join(lagging)}")
        time.sleep(0.2)


def _await_metadata(admin: Any, specs: list[TopicSpec], timeout: float) -> None:
    """Wait until the cluster metadata shows every topic with at least its partitions, so that a
    client started right after `apply` (or a second `apply`) sees the converged state."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(timeout=timeout)
        lagging = [
            s.name
            for s in specs
            if s.name not in md.topics
            or len(md.topics[s.name].partitions) < s.partitions
            or any(p.leader < 0 for p in md.topics[s.name].partitions.values())
        ]
        if not lagging:
            return
        if time.monotonic() > deadline:
            raise ConfigError(f"topics not ready after {timeout:.0f}s: {', '.join(lagging)}")
        time.sleep(0.2)
