"""Streams throughput and latency: validate -> group -> zero_variance -> grpo -> route in a real
`astraflow streams` Faust worker, against raw confluent-kafka produce -> consume of the same
records on the same broker (the ceiling of any Kafka-based stage in Python on this machine).

1,024-token trajectories (24 prompt + 1,000 generated tokens), groups of 8, each group one
TrajectoryBatch record as the workers send them (`astraflow.records.batches`); Samples come out as
one SampleBatch per group, as streams writes them.
- throughput: N trajectories produced as fast as possible; time from the first produce to the last
  record consumed (raw) or the last Sample consumed (pipeline).
- latency: the same records paced at a fixed rate below both capacities; raw: consume time minus
  produce time per record; pipeline: time from producing a group's last trajectory to consuming
  its last Sample (a group cannot be emitted before its last trajectory exists).

    python -m bench.streams_pipeline [--groups 256] [--rate 100] [--seconds 8] [--bootstrap H:P]

Uses ASTRAFLOW_TEST_BOOTSTRAP or --bootstrap if given, otherwise starts a throw-away broker. The
producer, the consumer and the Faust worker share the machine's cores.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

from astraflow import topics as topic_spec
from astraflow.config import KafkaSettings
from astraflow.kafka import TopicReader, make_admin, producer_config
from astraflow.records import SampleBatch, Trajectory, batches, decode, encode, group_id, traj_id
from bench.machine import describe
from tests.conftest import streams_cmd

REPO = Path(__file__).resolve().parent.parent
GROUP = 8
PIPELINE = [{"name": "zero_variance"}, {"name": "grpo"}]


def make_records(n_groups: int, prefix: str = "bench", seed: int = 0) -> list[tuple[bytes, bytes]]:
    """(key, value) of the records of n_groups groups of GROUP 1,024-token trajectories (tasks
    <prefix><g>), a group a TrajectoryBatch, as a worker sends them."""
    rng = np.random.default_rng(seed)
    owner = np.array([-1] * 24 + [0] * 1000, np.int8)
    out = []
    for g in range(n_groups):
        task = f"{prefix}{g}"
        group = []
        for i in range(GROUP):
            group.append(
                Trajectory(
                    traj_id=traj_id(task, 0, i),
                    group_id=group_id(task, 0),
                    task_id=task,
                    env="bench",
                    policies=["policy"],
                    tokens=rng.integers(0, 100, 1024).astype(np.int32),
                    owner=owner,
                    logprobs=np.where(owner >= 0, -rng.random(1024), 0).astype(np.float32),
                    versions=np.where(owner >= 0, 0, -1).astype(np.int32),
                    rewards={"policy": float(i % 2)},
                    group_size=GROUP,
                    sample_index=i,
                )
            )
        out += [(b.group_id.encode(), encode(b)) for b in batches(group, 1 << 20)]
    return out


def trajectories_in(_value: bytes) -> int:
    """Trajectories a produced record carries (every group fits one record here)."""
    return GROUP


def samples_in(value: bytes) -> int:
    """Samples a SampleBatch record of `samples.<policy>` carries."""
    return len(decode(value, SampleBatch).items)


class Reader(threading.Thread):
    """Reads a topic from its current end, recording (key, arrival time, create time, size) of the
    records whose key is in `keys`, until they carried `expect` trajectories or Samples (`units`)."""

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        expect: int,
        keys: set[bytes],
        units: Callable[[bytes], int],
    ) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import TopicPartition

        self.reader = TopicReader(
            settings, group=f"bench-{uuid.uuid4().hex[:6]}", **{"enable.auto.commit": False}
        )
        full = settings.topic(topic)
        ends = self.reader.end_offsets(full)
        # only what is produced from now on
        self.reader.consumer.assign([TopicPartition(full, p, hi) for p, hi in ends.items()])
        self.expect, self.keys, self.units, self.seen, self.count = expect, keys, units, [], 0
        self.done = threading.Event()

    def run(self) -> None:
        try:
            while self.count < self.expect and not self.done.is_set():
                msg = self.reader.poll(0.1)
                if msg is None or msg.key() not in self.keys:
                    continue
                self.count += self.units(msg.value() or b"")
                self.seen.append(
                    (msg.key(), time.time(), msg.timestamp()[1] / 1000.0, len(msg.value() or b""))
                )
        finally:
            self.reader.close()
            self.done.set()


def produce(
    settings: KafkaSettings, topic: str, records: list[tuple[bytes, bytes]], rate: float | None = None
) -> dict[bytes, float]:
    """Produce the records (paced at `rate` trajectories per second if given); returns key -> time
    the last record with that key was handed to the producer."""
    from confluent_kafka import Producer

    p = Producer(producer_config(settings))
    full = settings.topic(topic)
    # warm up: the idempotent producer's id and the topic's metadata, outside the measurement
    p.produce(settings.topic("bench-raw"), key=b"warmup", value=b"")
    p.list_topics(full, timeout=10)
    p.flush(30)
    sent: dict[bytes, float] = {}
    t0 = time.time()
    for i, (key, value) in enumerate(records):
        if rate:
            delay = t0 + i * GROUP / rate - time.time()
            if delay > 0:
                time.sleep(delay)
        while True:
            try:
                p.produce(full, key=key, value=value)
                break
            except BufferError:
                p.poll(0.05)
        sent[key] = time.time()
        p.poll(0)
    p.flush(60)
    return sent


def run_raw(settings: KafkaSettings, records: list, rate: float | None) -> tuple[float, list[float]]:
    reader = Reader(settings, "bench-raw", len(records) * GROUP, {k for k, _ in records}, trajectories_in)
    reader.start()
    t0 = time.time()
    produce(settings, "bench-raw", records, rate)
    reader.done.wait(300)
    elapsed = max(t for _, t, _, _ in reader.seen) - t0
    return elapsed, [(t - created) * 1000 for _, t, created, _ in reader.seen]


def run_pipeline(settings: KafkaSettings, records: list, rate: float | None) -> tuple[float, list[float]]:
    reader = Reader(settings, "samples.policy", len(records) * GROUP, {k for k, _ in records}, samples_in)
    reader.start()
    t0 = time.time()
    sent = produce(settings, "trajectories", records, rate)
    reader.done.wait(300)
    if reader.count < len(records) * GROUP:
        raise RuntimeError(f"only {reader.count} of {len(records) * GROUP} Samples arrived")
    last: dict[bytes, float] = {}
    for key, t, _, _ in reader.seen:
        last[key] = max(last.get(key, 0.0), t)
    elapsed = max(last.values()) - t0
    return elapsed, [(last[k] - sent[k]) * 1000 for k in last]


def start_worker(settings: KafkaSettings, tmp: Path) -> subprocess.Popen:
    recipe = {
        "name": "bench-streams",
        "policies": [{"name": "policy"}],
        "kafka": {"bootstrap": settings.bootstrap, "namespace": settings.namespace},
        "streams": {"pipeline": PIPELINE},
    }
    path = tmp / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    log = tmp / "worker.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASTRAFLOW_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        streams_cmd(path, tmp / "faust"),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp,
    )
    deadline = time.time() + 120
    while "[^Worker]: Ready" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"streams worker did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.25)
    return proc


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=256)
    ap.add_argument("--rate", type=float, default=100.0, help="trajectories/s of the latency runs")
    ap.add_argument("--seconds", type=float, default=8.0, help="length of the latency runs")
    ap.add_argument("--bootstrap", default=os.environ.get("ASTRAFLOW_TEST_BOOTSTRAP"))
    args = ap.parse_args()

    own_broker = None
    if not args.bootstrap:
        from astraflow import broker

        own_broker = Path(tempfile.mkdtemp(prefix="bench-broker-"))
        args.bootstrap = broker.start(port=0, data_dir=own_broker).bootstrap
    settings = KafkaSettings(bootstrap=args.bootstrap, namespace=f"bench{uuid.uuid4().hex[:8]}")
    specs = topic_spec.expand(topic_spec.load_spec(), ["policy"], settings)
    traj_spec = topic_spec.find(specs, "trajectories")
    raw_spec = topic_spec.TopicSpec(
        name=settings.topic("bench-raw"),
        base="bench-raw",
        record="TrajectoryBatch",
        partitions=traj_spec.partitions,
        replication=traj_spec.replication,
        configs=traj_spec.configs,
    )
    topic_spec.apply(make_admin(settings), [*specs, raw_spec])

    records = make_records(args.groups)
    n_lat = max(GROUP, int(args.rate * args.seconds) // GROUP * GROUP)
    lat_records = make_records(n_lat // GROUP, "lat", seed=1)  # tasks of their own
    mb = sum(len(v) for _, v in records) / 1e6
    tmp = Path(tempfile.mkdtemp(prefix="bench-streams-"))
    proc = None
    try:
        raw_t, _ = run_raw(settings, records, None)
        _, raw_lat = run_raw(settings, lat_records, args.rate)
        proc = start_worker(settings, tmp)
        pipe_t, _ = run_pipeline(settings, records, None)
        _, pipe_lat = run_pipeline(settings, lat_records, args.rate)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        if own_broker is not None:
            from astraflow import broker

            broker.stop(own_broker)
    n = len(records) * GROUP
    print(f"machine: {describe()}")
    print(
        f"{n} trajectories of 1,024 tokens ({mb / n * 1e3:.1f} kB each, {mb:.1f} MB), groups of {GROUP}, "
        f"a group a record"
    )
    print("| | trajectories/s | MB/s | ratio | latency p50 ms | latency p99 ms |")
    print("|---|---:|---:|---:|---:|---:|")
    print(
        f"| raw confluent-kafka produce -> consume | {n / raw_t:,.0f} | {mb / raw_t:,.1f} | 1.00 | "
        f"{pct(raw_lat, 50):.1f} | {pct(raw_lat, 99):.1f} |"
    )
    print(
        f"| streams validate -> group -> zero_variance -> grpo -> route | {n / pipe_t:,.0f} | "
        f"{mb / pipe_t:,.1f} | {raw_t / pipe_t:.3f} | {pct(pipe_lat, 50):.1f} | {pct(pipe_lat, 99):.1f} |"
    )
    print(
        f"latency runs: {args.rate:.0f} trajectories/s for {args.seconds:.0f} s; pipeline latency is per "
        f"group (its last trajectory produced -> its last Sample consumed)"
    )


if __name__ == "__main__":
    main()
