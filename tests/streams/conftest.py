"""Fixtures of the streams broker tests: a recipe in the test's namespace, streams workers run as
`astraflow streams` subprocesses (started and stopped by PID), and plain confluent-kafka
producers and readers to feed and inspect the topics."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

from astraflow.config import KafkaSettings
from astraflow.records import Record, SampleBatch, decode, encode, samples_of
from tests.conftest import MakeTopics, streams_cmd, subprocess_env
from tests.kafka_helpers import committed, end_offsets, read_messages

READY_MARK = "[^Worker]: Ready"


@dataclass
class Worker:
    proc: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class StreamsHarness:
    kafka: KafkaSettings
    root: Path
    recipe: Path
    policies: list[str]
    workers: list[Worker] = field(default_factory=list)

    # ------------------------------------------------------------ workers

    def start(
        self, *, extra_env: dict[str, str] | None = None, wait: bool = True, timeout: float = 120.0
    ) -> Worker:
        log = self.root / f"worker{len(self.workers)}.log"
        env = subprocess_env(**(extra_env or {}))
        proc = subprocess.Popen(
            streams_cmd(self.recipe, self.root / "faust", "--instance-id", f"w{len(self.workers)}"),
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(self.root),
        )
        worker = Worker(proc, log)
        self.workers.append(worker)
        if wait:
            self.wait_ready(worker, timeout)
        return worker

    def wait_ready(self, worker: Worker, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if READY_MARK in worker.text():
                return
            if worker.proc.poll() is not None:
                pytest.fail(f"streams worker exited with {worker.proc.returncode}:\n{worker.text()[-4000:]}")
            time.sleep(0.25)
        pytest.fail(f"streams worker not ready after {timeout}s:\n{worker.text()[-4000:]}")

    def stop(self, worker: Worker, timeout: float = 60.0) -> int:
        """SIGTERM, then wait; returns the exit status."""
        worker.proc.send_signal(signal.SIGTERM)
        try:
            return worker.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            worker.proc.kill()
            worker.proc.wait(10)
            pytest.fail(f"streams worker ignored SIGTERM for {timeout}s:\n{worker.text()[-4000:]}")

    def kill(self, worker: Worker) -> None:
        worker.proc.send_signal(signal.SIGKILL)
        worker.proc.wait(30)

    def cleanup(self) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait(30)

    # ------------------------------------------------------------ topics

    def producer(self) -> Any:
        from confluent_kafka import Producer

        from astraflow.kafka import producer_config

        return Producer(producer_config(self.kafka))

    def send(
        self, items: list[tuple[bytes | None, bytes | Record]], topic: str = "trajectories"
    ) -> list[tuple[int, int]]:
        """Produce (key, value) pairs in order; returns their (partition, offset)."""
        producer = self.producer()
        where: dict[int, tuple[int, int]] = {}
        errors: list[str] = []

        def done(i: int) -> Any:
            def cb(err: Any, msg: Any) -> None:
                if err is not None:
                    errors.append(str(err))
                else:
                    where[i] = (msg.partition(), msg.offset())

            return cb

        for i, (key, value) in enumerate(items):
            data = value if isinstance(value, bytes) else encode(value)
            producer.produce(self.kafka.topic(topic), key=key, value=data, on_delivery=done(i))
            producer.poll(0)
        producer.flush(30)
        assert not errors, errors
        return [where[i] for i in range(len(items))]

    def uncommitted(self, topic: str = "trajectories", group: str = "streams") -> dict[int, int]:
        """partition -> records of `topic` past the offset the streams' consumer group committed
        (only partitions with any)."""
        done = {p: max(offset, 0) for p, offset in committed(self.kafka, group, topic).items()}
        ends = end_offsets(self.kafka, topic)
        return {p: end - done.get(p, 0) for p, end in ends.items() if end > done.get(p, 0)}

    def read(
        self, topic: str, *, expect: int | None = None, timeout: float = 60.0, settle: float = 3.0
    ) -> list[Any]:
        """All records of a topic (base name): read until `expect` are there (or `timeout`), then
        `settle` more seconds with nothing new, so extra records (duplicates) are seen too."""
        until = None if expect is None else (lambda m: len(m) >= expect)
        return read_messages(self.kafka, topic, until=until, timeout=timeout, settle=settle)

    def records(
        self, topic: str, *, expect: int | None = None, timeout: float = 60.0, settle: float = 3.0
    ) -> list[Any]:
        """The decoded records of a topic, a SampleBatch's Samples opened (streams sends a group's
        Samples for a policy as one record); `expect` counts them opened."""

        def opened(msgs: list[Any]) -> list[Any]:
            out: list[Any] = []
            for m in msgs:
                record = decode(m.value())
                out += samples_of(record) if isinstance(record, SampleBatch) else [record]
            return out

        until = None if expect is None else (lambda msgs: len(opened(msgs)) >= expect)
        return opened(read_messages(self.kafka, topic, until=until, timeout=timeout, settle=settle))

    def last_metrics(self, instance: str, timeout: float = 30.0, until: Any = None) -> dict[str, float]:
        """The values of the newest Metric of one worker instance (optionally: wait until `until(values)`)."""
        deadline = time.monotonic() + timeout
        values: dict[str, float] = {}
        while time.monotonic() < deadline:
            mine = [r for r in self.records("metrics", settle=0.5, timeout=5) if r.id == instance]
            if mine:
                values = mine[-1].values
                if until is None or until(values):
                    return values
            time.sleep(1.0)
        return values


def write_recipe(
    path: Path, kafka: KafkaSettings, policies: list[str], pipeline: list[dict[str, Any]], **streams: Any
) -> Path:
    recipe = {
        "name": "streams-test",
        "policies": [{"name": p} for p in policies],
        "max_staleness": 2,
        "kafka": {"bootstrap": kafka.bootstrap, "namespace": kafka.namespace},
        "streams": {
            "pipeline": pipeline,
            "metrics_every_s": 1.0,
            "sweep_every_s": 0.5,
            "commit_every_s": 1.0,
            **streams,
        },
    }
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


class MakeHarness(Protocol):
    """The `streams_harness` fixture: a harness of `policies` and `pipeline` with its topics created."""

    def __call__(
        self, policies: list[str], pipeline: list[dict[str, Any]], **streams: Any
    ) -> StreamsHarness: ...


@pytest.fixture
def streams_harness(kafka: KafkaSettings, topics: MakeTopics, tmp_path: Path) -> Iterator[MakeHarness]:
    """Call with (policies, pipeline, **streams settings): topics created, recipe written."""
    made: list[StreamsHarness] = []

    def make(policies: list[str], pipeline: list[dict[str, Any]], **streams: Any) -> StreamsHarness:
        topics(policies)
        root = tmp_path / f"h{len(made)}"
        root.mkdir()
        recipe = write_recipe(root / "recipe.yaml", kafka, policies, pipeline, **streams)
        h = StreamsHarness(kafka=kafka, root=root, recipe=recipe, policies=policies)
        made.append(h)
        return h

    yield make
    for h in made:
        h.cleanup()
