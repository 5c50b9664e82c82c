"""What the dashboard and `astraflow status` read from Kafka: consumer lag per stage, dead
letters, the latest metrics and weight versions, against the real broker."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from astraflow import broker
from astraflow.config import KafkaSettings
from astraflow.kafka import client_config
from astraflow.records import Metric, WeightVersion, encode
from astraflow.runner.collector import MetricsCollector
from tests.conftest import REPO, MakeTopics, subprocess_env
from tests.kafka_helpers import commit

pytestmark = [pytest.mark.broker]


def test_collector_reports_lag_dead_letters_metrics_and_weights(
    kafka: KafkaSettings, topics: MakeTopics
) -> None:
    topics(["solver"])
    producer = Producer(client_config(kafka))
    for partition, n in ((0, 8), (1, 3)):  # the workers will have committed 4 and 1 of them
        for _ in range(n):
            producer.produce(kafka.topic("tasks"), b"task", partition=partition)
    for _ in range(3):
        producer.produce(kafka.topic("deadletter"), b"dead")
    producer.produce(
        kafka.topic("metrics"),
        encode(
            Metric(
                component="trainer", id="trainer.solver", step=7, values={"step": 7.0, "reward.mean": 0.25}
            )
        ),
    )
    producer.produce(
        kafka.topic("weights"),
        key=b"solver",
        value=encode(
            WeightVersion(
                policy="solver", version=3, step=7, snapshot_version=3, snapshot_uri="file:///store/solver/3"
            )
        ),
    )
    assert producer.flush(30) == 0
    commit(kafka, "workers", "tasks", {0: 4, 1: 1})

    collector = MetricsCollector(kafka, worker_group="workers").start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            snap = collector.snapshot()
            if snap.lag.get("tasks") is not None and snap.deadletters and snap.metrics_seen and snap.weights:
                break
            time.sleep(0.5)
    finally:
        collector.stop()
    assert snap.lag == {"tasks": (8 - 4) + (3 - 1)}
    # every probe is kept for the scaling advice, which needs to see whether a lag grows
    assert collector.history()[("collector", "lag")][-1][2] == {"lag.tasks": 6.0}
    assert snap.deadletters == 3
    trainer = snap.of("trainer")[0]
    assert (trainer.id, trainer.step, trainer.values["reward.mean"]) == ("trainer.solver", 7, 0.25)
    assert snap.weights["solver"].version == 3


def test_collector_stopped_at_once_still_reads_every_metric_there(
    kafka: KafkaSettings, topics: MakeTopics, tmp_path: Path
) -> None:
    """The run report is written from what the collector read: stopped the moment the trainers
    are done, it reads on to the topic's end (one short poll lost a 3-node run's last 6 steps)."""
    topics(["solver"])
    producer = Producer(client_config(kafka))
    for step in range(40):
        producer.produce(
            kafka.topic("metrics"),
            encode(Metric(component="trainer", id="trainer.solver", step=step, values={"step": float(step)})),
        )
    assert producer.flush(30) == 0
    jsonl = tmp_path / "metrics.jsonl"
    collector = MetricsCollector(kafka, jsonl=jsonl).start()
    collector.stop()  # before its group has even been joined
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    steps = [
        r["step"] for r in rows if r["component"] == "trainer"
    ]  # the collector's lag probe may be there too
    assert steps == list(range(40))
    assert collector.snapshot().of("trainer")[0].step == 39


def test_status_command_prints_the_dashboard_of_a_running_system(
    kafka: KafkaSettings, topics: MakeTopics
) -> None:
    topics(["solver"])
    cmd = [sys.executable, "-m", "astraflow.cli", "status", "--bootstrap", kafka.bootstrap, "--wait", "3"]
    env = subprocess_env(ASTRAFLOW_NAMESPACE=kafka.namespace or "", COLUMNS="200")
    # nothing running: a clear error, not an empty table
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "no metrics in the last" in out.stdout + out.stderr, out
    producer = Producer(client_config(kafka))
    producer.produce(
        kafka.topic("metrics"),
        encode(
            Metric(
                component="trainer", id="trainer.solver", step=12, values={"step": 12.0, "reward.mean": 0.5}
            )
        ),
    )
    assert producer.flush(30) == 0
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out
    assert "solver" in out.stdout and "0.500" in out.stdout, out.stdout
    assert "scaling: unknown: no trainer has reported steps" in out.stdout, out.stdout  # one step so far


PROBE_FROM_THE_FIRST_SECOND = textwrap.dedent("""
    import sys, time
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic
    from astraflow.config import KafkaSettings
    from astraflow.kafka import client_config, make_admin
    from astraflow.runner.collector import Probes, consumer_lag

    settings = KafkaSettings(bootstrap=sys.argv[1])
    admin = make_admin(settings)
    for future in admin.create_topics([NewTopic("tasks", 4, 1)]).values():
        future.result(30)
    producer = Producer(client_config(settings))
    for p in range(4):
        producer.produce("tasks", b"task", partition=p)
    assert producer.flush(30) == 0
    probes = Probes(settings)
    lags, errors, end = [], 0, time.monotonic() + 6
    while time.monotonic() < end:  # the groups' coordinator is being created all this time
        try:
            lags.append(consumer_lag(settings, {"tasks": f"g{len(lags) % 3}"}, probes))
        except Exception:
            errors += 1
    probes.close()
    print(len(lags), errors, lags[-1])
""")


@pytest.mark.slow
def test_lag_probes_from_the_first_second_of_a_new_broker(tmp_path: Path) -> None:
    # `astraflow run` probes lag within a second of starting its own broker, while the broker is
    # still creating __consumer_offsets. The admin client's ListConsumerGroupOffsets crashed the
    # whole process then (SIGSEGV in librdkafka, 1 new broker in 3 here); the probes must not.
    for attempt in range(2):
        data = tmp_path / f"broker{attempt}"
        state = broker.start(port=0, data_dir=data)
        try:
            out = subprocess.run(
                [sys.executable, "-c", PROBE_FROM_THE_FIRST_SECOND, state.bootstrap],
                env=subprocess_env(),
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
            )
        finally:
            broker.stop(data)
        assert out.returncode == 0, (
            f"attempt {attempt}: exit {out.returncode}\n{out.stdout}{out.stderr[-3000:]}"
        )
        calls, _errors, last = out.stdout.split(" ", 2)
        assert int(calls) > 50 and last.strip() == "{'tasks': 4}", out.stdout
