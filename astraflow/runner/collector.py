"""Reads what a running system reports, for the dashboard, `astraflow status` and the run report.

Sources, all from Kafka (so it works from any shell, for any region):
- `metrics`: every Metric record (kept as the latest values per component instance, and appended
  to `<run_dir>/metrics.jsonl` when a run directory is given);
- `weights`: the latest WeightVersion per policy;
- consumer lag per stage: committed offsets of the workers' and the streams' consumer groups
  against the high watermarks of `tasks` and `trajectories`; the trainers report their own
  position (they keep offsets in their checkpoints). Each probe is also kept in the history and in
  metrics.jsonl as component `collector`, id `lag` (values `lag.<stage>`), for the scaling advice
  (`advice.py`), which needs to know whether a lag grows;
- `deadletter`: how many records it holds.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from astraflow.config import KafkaSettings
from astraflow.errors import AstraFlowError
from astraflow.kafka import KafkaReadError, TopicReader, make_consumer, watermarks
from astraflow.records import Metric, RecordError, WeightVersion, decode
from astraflow.topics import DEADLETTER, METRICS, TASKS, TRAJECTORIES, WEIGHTS

log = logging.getLogger(__name__)

DRAIN_S = 30.0  # at stop, how long to read on to the topics' ends
HISTORY_S = 600.0  # how far back history() reaches


@dataclass
class Instance:
    component: str
    id: str
    region: str
    time: float
    step: int
    values: dict[str, float]


@dataclass
class Snapshot:
    """What the dashboard shows, at one moment."""

    instances: dict[tuple[str, str], Instance] = field(default_factory=dict)
    weights: dict[str, WeightVersion] = field(default_factory=dict)
    lag: dict[str, int] = field(default_factory=dict)
    deadletters: int = 0
    metrics_seen: int = 0
    started: float = field(default_factory=time.time)

    def of(self, component: str) -> list[Instance]:
        return sorted((i for (c, _), i in self.instances.items() if c == component), key=lambda i: i.id)


class MetricsCollector:
    """Consumes `metrics` and `weights` in a background thread; `snapshot()` is thread-safe."""

    def __init__(
        self,
        settings: KafkaSettings,
        jsonl: Path | None = None,
        since_s: float | None = None,
        worker_group: str = "workers",
        streams_group: str | None = None,
    ) -> None:
        self.settings = settings
        self.jsonl = jsonl
        self.since_s = since_s
        self.worker_group = worker_group
        self.streams_group = streams_group
        self._snap = Snapshot()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # per instance, its metrics of the last HISTORY_S seconds (the scaling advice reads 120 s):
        # unbounded, it grew ~7 MiB every 10 minutes of a run (bench/soak.py)
        self._history: dict[tuple[str, str], deque[tuple[int, float, dict[str, float]]]] = defaultdict(deque)

    # --------------------------------------------------------------------------- reading

    def start(self) -> MetricsCollector:
        self._thread = threading.Thread(target=self._run, name="collector", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=DRAIN_S + 15)

    def _run(self) -> None:
        group = f"astraflow-collector-{uuid.uuid4().hex[:8]}"
        reader = TopicReader(self.settings, [METRICS, WEIGHTS], group=group, **{"enable.auto.commit": False})
        # The probe consumers live for the whole run, made and dropped in this thread: a client
        # created and destroyed every few seconds is what confluent-kafka's garbage-collection
        # crashes need (confluent-kafka-python #2129), and it costs a connection each time.
        probes = Probes(self.settings)
        reader.subscribe()
        out: IO[str] | None = open(self.jsonl, "w") if self.jsonl else None  # noqa: SIM115
        next_lag = 0.0
        try:
            while not self._stop.is_set():
                for msg in reader.consume(500, 0.1):  # stop() waits for this wait: at a run's end
                    self._ingest(msg.topic(), msg.value(), out)
                if out is not None:
                    out.flush()
                if time.monotonic() >= next_lag:
                    next_lag = time.monotonic() + 3.0
                    self._refresh_lag(probes, out)
            self._drain(reader, out)
        except Exception:  # noqa: BLE001 - the dashboard must never take the run down
            log.exception("metrics collector failed")
        finally:
            reader.close()
            probes.close()
            if out is not None:
                out.close()

    def _drain(self, reader: TopicReader, out: IO[str] | None) -> None:
        """Read `metrics` and `weights` to the ends they have now, for the run report: the last
        steps' metrics may still be on their way to this consumer (after a broker died, it takes
        seconds to find a partition's new leader), and one short poll lost them. Each topic on its
        own: one whose ends the cluster cannot give (no leader yet) does not hold up the other."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + DRAIN_S
        ends: dict[tuple[str, int], int] = {}
        for topic in reader.topics:
            try:
                ends.update(
                    {
                        (topic, p): high
                        for p, high in reader.end_offsets(
                            topic, max(1.0, deadline - time.monotonic())
                        ).items()
                    }
                )
            except (KafkaException, KafkaReadError) as exc:
                log.warning(
                    "metrics collector: no end offsets of %s (%s); the report may miss its last records",
                    topic,
                    exc,
                )
        try:
            for msg in reader.to_end(max(0.0, deadline - time.monotonic()), ends=ends):
                self._ingest(msg.topic(), msg.value(), out)
        except (KafkaException, AstraFlowError) as exc:  # KafkaReadError is one
            log.warning("metrics collector: %s; the report may miss the last records", exc)

    def _ingest(self, topic: str, value: bytes, out: IO[str] | None) -> None:
        try:
            record: Any = decode(value)
        except RecordError as exc:
            log.warning("unreadable record on %s: %s", topic, exc)
            return
        if isinstance(record, WeightVersion):
            with self._lock:
                old = self._snap.weights.get(record.policy)
                if old is None or record.version >= old.version:
                    self._snap.weights[record.policy] = record
            return
        if not isinstance(record, Metric):
            return
        if self.since_s is not None and record.time < time.time() - self.since_s:
            return
        if out is not None:
            out.write(
                json.dumps(
                    {
                        "component": record.component,
                        "id": record.id,
                        "region": record.region,
                        "time": record.time,
                        "step": record.step,
                        "values": record.values,
                    }
                )
                + "\n"
            )
        key = (record.component, record.id)
        with self._lock:
            self._snap.metrics_seen += 1
            inst = self._snap.instances.get(key)
            if inst is None:
                inst = self._snap.instances[key] = Instance(
                    record.component, record.id, record.region, record.time, record.step, {}
                )
            if record.time >= inst.time:
                inst.values.update(record.values)
                inst.time, inst.step, inst.region = record.time, record.step, record.region
            self._remember(key, (record.step, record.time, record.values))

    def _refresh_lag(self, probes: Probes, out: IO[str] | None = None) -> None:
        try:
            lag = consumer_lag(
                self.settings, {TASKS: self.worker_group, TRAJECTORIES: self.streams_group}, probes
            )
            dead = topic_size(self.settings, DEADLETTER, probes)
        except Exception as exc:  # noqa: BLE001 - lag is best effort while the cluster starts
            log.debug("lag refresh failed: %s", exc)
            return
        now = time.time()
        values = {f"lag.{stage}": float(n) for stage, n in lag.items()}
        if values and out is not None:
            out.write(
                json.dumps(
                    {
                        "component": "collector",
                        "id": "lag",
                        "region": "local",
                        "time": now,
                        "step": -1,
                        "values": values,
                    }
                )
                + "\n"
            )
        with self._lock:
            self._snap.lag.update(lag)
            self._snap.deadletters = dead
            if values:
                self._remember(("collector", "lag"), (-1, now, values))

    # --------------------------------------------------------------------------- views

    def snapshot(self) -> Snapshot:
        with self._lock:
            snap = Snapshot(
                instances={
                    k: Instance(**{**v.__dict__, "values": dict(v.values)})
                    for k, v in self._snap.instances.items()
                },
                weights=dict(self._snap.weights),
                lag=dict(self._snap.lag),
                deadletters=self._snap.deadletters,
                metrics_seen=self._snap.metrics_seen,
                started=self._snap.started,
            )
        return snap

    def _remember(self, key: tuple[str, str], entry: tuple[int, float, dict[str, float]]) -> None:
        """Keep `entry` in the history of `key`, forgetting what is older than HISTORY_S before it."""
        kept = self._history[key]
        kept.append(entry)
        while kept and kept[0][1] < entry[1] - HISTORY_S:
            kept.popleft()

    def history(self) -> dict[tuple[str, str], list[tuple[int, float, dict[str, float]]]]:
        with self._lock:
            return {k: list(v) for k, v in self._history.items()}


class Probes:
    """Consumers that are never subscribed: one for watermarks, one per consumer group for its
    committed offsets (`Consumer.committed`, an OffsetFetch through the group's own coordinator
    lookup). Not `AdminClient.list_consumer_group_offsets`: on a NOT_COORDINATOR answer, which a
    new broker gives while it creates `__consumer_offsets`, librdkafka (2.16 included) dereferences
    a NULL consumer group in its main thread and the whole process dies with SIGSEGV (librdkafka
    #5040). `astraflow run` probed lag within a second of starting its broker and died that way
    in CI; on fresh brokers here the admin call crashed the process 9 times in 15, `committed()`
    0 times in 20."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.consumer = self._make("astraflow-probe")
        self._groups: dict[str, Any] = {}

    def _make(self, group: str) -> Any:
        return make_consumer(self.settings, group, **{"enable.auto.commit": False})

    def committed(self, group: str, partitions: list[Any], timeout: float = 5.0) -> list[Any]:
        """Committed offsets of the base consumer group `group` (namespace applied)."""
        if group not in self._groups:
            self._groups[group] = self._make(group)
        return self._groups[group].committed(partitions, timeout=timeout)

    def close(self) -> None:
        for consumer in (self.consumer, *self._groups.values()):
            consumer.close()
        self._groups.clear()


def topic_size(settings: KafkaSettings, base: str, probes: Probes) -> int:
    """Records in a topic (sum of high watermarks minus low; fine for un-compacted topics)."""
    marks = watermarks(probes.consumer, settings.topic(base))
    return sum(max(0, high - low) for low, high in marks.values())


def consumer_lag(settings: KafkaSettings, groups: dict[str, str | None], probes: Probes) -> dict[str, int]:
    """Unconsumed records per topic for the consumer group reading it: {topic base: lag}."""
    from confluent_kafka import TopicPartition

    lag: dict[str, int] = {}
    for base, group in groups.items():
        if group is None:
            continue
        topic = settings.topic(base)
        highs = {p: high for p, (_, high) in watermarks(probes.consumer, topic).items()}
        if not highs:
            continue
        found = probes.committed(group, [TopicPartition(topic, p) for p in highs])
        committed = {tp.partition: tp.offset for tp in found}  # OFFSET_INVALID (< 0) where none yet
        lag[base] = sum(max(0, high - max(0, committed.get(p, 0))) for p, high in highs.items())
    return lag
