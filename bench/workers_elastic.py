"""Rebalance pauses of the workers' consumer group: how long a task waits when workers join or leave.

Members of one consumer group on an 8-partition `tasks` topic, each a consumer with the workers'
own settings (`workers.startup.task_consumer_overrides`), in threads of this process: they take
messages, store offsets after "processing" and commit on revoke, as the worker does. A producer
writes a steady stream of time-stamped messages round-robin over the partitions. Each message is held
`--episode` seconds before its offset is stored; a revoked partition's messages in flight are released
(re-run by the new owner), as the worker cancels a revoked task's episodes. Membership goes 1 -> 6 (one
join every `--step` seconds) -> 2 (one `close()` every step), as in tests/e2e/test_elastic_scale.py.

The pause of a join or leave = the longest wait (last taken - produced: a released message waits for
its re-delivery) of a message produced between
that change and the next, less the median wait of the whole run; "stalled" = partitions where some
message of the window waited 250 ms more than the median. Two windows without a change ("steady")
give the noise floor of the machine. Variants, one after another on the same broker:

    cooperative-sticky       the workers' setting (the baseline)
    range (eager)            the classic default: every rebalance revokes every partition
    cooperative + static     cooperative-sticky with group.instance.id (static membership)
    consumer (KIP-848)       group.protocol=consumer: broker-side incremental assignment

    python -m bench.workers_elastic [--step 6] [--rate 200] [--variants a,b] [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import struct
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from astraflow import broker
from astraflow.config import KafkaSettings
from astraflow.kafka import make_admin, make_consumer, make_producer
from bench.machine import describe

PARTITIONS = 8
STALL_S = 0.25
VARIANTS: dict[str, dict[str, Any]] = {
    "cooperative-sticky": {},
    "range (eager)": {"partition.assignment.strategy": "range"},
    "cooperative + static": {"group.instance.id": "{member}"},
    "consumer (KIP-848)": {
        "group.protocol": "consumer",
        "partition.assignment.strategy": None,
        "session.timeout.ms": None,
        "heartbeat.interval.ms": None,
    },
}


class Member(threading.Thread):
    """One worker's consumer: poll, record (partition, offset, produced, consumed), hold each message
    `episode_s` (an episode in flight), then store its offset. A revoked partition's messages in
    flight are released, not finished, as the worker cancels them: their new owner runs them again."""

    def __init__(
        self, name: str, consumer: Any, topic: str, log: list[tuple[int, int, float, float]], episode_s: float
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.consumer = consumer
        self.topic = topic
        self.log = log
        self.episode_s = episode_s
        self.in_flight: dict[tuple[int, int], float] = {}  # (partition, offset) -> done at
        self.released = 0
        self.stopping = threading.Event()
        self.consumer.subscribe([topic], on_revoke=self._on_revoke, on_lost=self._on_revoke)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        revoked = {tp.partition for tp in partitions}
        for key in [k for k in self.in_flight if k[0] in revoked]:
            del self.in_flight[key]
            self.released += 1
        with contextlib.suppress(Exception):  # nothing stored yet is an error; the worker ignores it too
            consumer.commit(asynchronous=False)

    def _finish(self, now: float) -> None:
        from confluent_kafka import TopicPartition

        for (p, off), done in list(self.in_flight.items()):
            if done <= now:  # one duration for all: done in the order taken, as the OffsetTracker needs
                del self.in_flight[(p, off)]
                self.consumer.store_offsets(offsets=[TopicPartition(self.topic, p, off + 1)])

    def run(self) -> None:
        while not self.stopping.is_set():
            msg = self.consumer.poll(0.02)
            now = time.time()
            self._finish(now)
            if msg is None or msg.error() is not None:
                continue
            (produced,) = struct.unpack("!d", msg.value())
            self.log.append((msg.partition(), msg.offset(), produced, now))
            self.in_flight[(msg.partition(), msg.offset())] = now + self.episode_s
        # like the worker's drain: finish what is in flight, then leave
        deadline = time.time() + self.episode_s + 1
        while self.in_flight and time.time() < deadline:
            self.consumer.poll(0.02)
            self._finish(time.time())
        self.consumer.close()  # leaves the group (a static member does not)

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)


def producer_loop(settings: KafkaSettings, topic: str, rate: float, stop: threading.Event) -> None:
    producer = make_producer(settings)
    i, start = 0, time.monotonic()
    while not stop.is_set():
        producer.produce(topic, struct.pack("!d", time.time()), partition=i % PARTITIONS)
        producer.poll(0)
        i += 1
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    producer.flush(30)


def run_variant(
    settings: KafkaSettings, name: str, step_s: float, rate: float, episode_s: float
) -> dict[str, Any]:
    from confluent_kafka.admin import NewTopic

    from workers.startup import task_consumer_overrides

    ns = settings.model_copy(update={"namespace": f"bench{uuid.uuid4().hex[:8]}"})
    topic = ns.topic("tasks")
    admin = make_admin(ns)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    log: list[tuple[int, int, float, float]] = []
    stop = threading.Event()
    prod = threading.Thread(target=producer_loop, args=(ns, topic, rate, stop), daemon=True)
    prod.start()

    def member(i: int) -> Member:
        overrides = task_consumer_overrides(f"m{i}")
        for key, value in VARIANTS[name].items():  # None: librdkafka's default
            overrides[key] = value.format(member=f"m{i}") if isinstance(value, str) else value
        m = Member(f"m{i}", make_consumer(ns, "workers", **overrides), topic, log, episode_s)
        m.start()
        return m

    members = [member(0)]
    time.sleep(step_s)  # the first member's own join is not a rebalance of a working group
    # a window with no change: the noise floor of this machine, to read the pauses against
    events: list[tuple[str, float]] = [("steady 1", time.time())]
    time.sleep(step_s)
    for i in range(1, 6):
        events.append((f"join {i}->{i + 1}", time.time()))
        members.append(member(i))
        time.sleep(step_s)
    events.append(("steady 6", time.time()))
    time.sleep(step_s)
    for j, m in enumerate(members[:4]):
        events.append((f"leave {6 - j}->{5 - j}", time.time()))
        m.stop()
        time.sleep(step_s)
    stop.set()
    prod.join(60)
    time.sleep(2.0)
    for m in members[4:]:
        m.stop()
    result = measure(name, log, events)
    result["released"] = sum(m.released for m in members)
    return result


def measure(
    name: str, log: list[tuple[int, int, float, float]], events: list[tuple[str, float]]
) -> dict[str, Any]:
    first: dict[tuple[int, int], tuple[float, float]] = {}
    deliveries = defaultdict(int)
    for p, off, produced, consumed in log:
        deliveries[(p, off)] += 1
        first[(p, off)] = (produced, max(consumed, first.get((p, off), (0.0, 0.0))[1]))
    waits = sorted(c - p for p, c in first.values())
    base = statistics.median(waits)
    rows = []
    for k, (label, t) in enumerate(events):
        end = events[k + 1][1] if k + 1 < len(events) else float("inf")
        worst, stalled = 0.0, set()
        for (p, _off), (produced, consumed) in first.items():
            if t <= produced < end:
                worst = max(worst, consumed - produced)
                if consumed - produced > base + STALL_S:
                    stalled.add(p)
        rows.append((label, max(0.0, worst - base), len(stalled)))
    return {
        "variant": name,
        "median_wait_ms": base * 1000,
        "events": rows,
        "messages": len(first),
        "redelivered": sum(n - 1 for n in deliveries.values()),
    }


def report(results: list[dict[str, Any]]) -> None:
    print(
        "\n| variant | steady: pause s (max) | joins: pause s (median / max) | partitions stalled per join | "
        "leaves: pause s (median / max) | partitions stalled per leave | released in flight | re-delivered "
        "| vs baseline (max pause) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    baseline = None
    for r in results:
        joins = [e for e in r["events"] if e[0].startswith("join")]
        leaves = [e for e in r["events"] if e[0].startswith("leave")]
        steady = [e for e in r["events"] if e[0].startswith("steady")]
        worst = max(e[1] for e in joins + leaves)
        baseline = baseline or worst
        print(
            f"| {r['variant']} | {max(e[1] for e in steady):.2f} | "
            f"{statistics.median(e[1] for e in joins):.2f} / {max(e[1] for e in joins):.2f} | "
            f"{statistics.mean(e[2] for e in joins):.1f} | "
            f"{statistics.median(e[1] for e in leaves):.2f} / {max(e[1] for e in leaves):.2f} | "
            f"{statistics.mean(e[2] for e in leaves):.1f} | {r['released']} | {r['redelivered']} | "
            f"{worst / baseline:.1f}x |"
        )
    print("\nper event (pause s, partitions stalled):")
    for r in results:
        print(
            f"  {r['variant']} (median wait {r['median_wait_ms']:.1f} ms, {r['messages']} messages): "
            + ", ".join(f"{label} {p:.2f}/{s}" for label, p, s in r["events"])
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step", type=float, default=6.0, help="seconds between membership changes")
    ap.add_argument("--rate", type=float, default=200.0, help="messages per second over all partitions")
    ap.add_argument("--episode", type=float, default=1.0, help="seconds each message is held in flight")
    ap.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated, from: " + ", ".join(VARIANTS)
    )
    ap.add_argument("--bootstrap", help="an existing broker (default: start one)")
    args = ap.parse_args()
    print(f"machine: {describe()}")
    with tempfile.TemporaryDirectory() as tmp:
        bootstrap = args.bootstrap
        if not bootstrap:
            bootstrap = broker.start(port=0, data_dir=Path(tmp) / "kafka").bootstrap
        try:
            settings = KafkaSettings(bootstrap=bootstrap)
            results = []
            for name in args.variants.split(","):
                print(f"running {name} ...", flush=True)
                results.append(run_variant(settings, name, args.step, args.rate, args.episode))
            report(results)
        finally:
            if not args.bootstrap:
                broker.stop(Path(tmp) / "kafka")


if __name__ == "__main__":
    main()
