"""A task is rolled out with at least the weights whose progress admitted it (Task.min_versions):
the feeder hears of a version before the workers have loaded it, and a task rolled out with the
version before would be one version staler than admission allowed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from astraflow.config import KafkaSettings
from astraflow.records import Task, decode, encode
from tests.workers.conftest import make_recipe
from workers.worker import Worker


class FakeEngine:
    def __init__(self, version: int) -> None:
        self.version = version


def task(**versions: int) -> Task:
    return Task(task_id="t", env="arithmetic", roles={"solver": "policy"}, min_versions=versions)


def test_min_versions_travel_on_the_wire() -> None:
    assert decode(encode(task(policy=7)), Task).min_versions == {"policy": 7}


def test_a_task_waits_for_the_weights_it_was_admitted_with(tmp_path: Path) -> None:
    worker = Worker(make_recipe(worker={"weights_wait_s": 5.0}), tmp_path, KafkaSettings(bootstrap="x:1"))
    engine = FakeEngine(3)
    worker.engines = {"policy": engine}

    async def main() -> float:
        loop = asyncio.get_running_loop()
        loop.call_later(0.2, setattr, engine, "version", 4)  # the follower loads version 4
        start = loop.time()
        await worker._wait_for_weights(task(policy=4))
        return loop.time() - start

    waited = asyncio.run(main())
    assert 0.15 <= waited < 2.0 and engine.version == 4
    assert worker.counts["weights_late"] == 0


def test_weights_that_never_come_do_not_hang_the_task(tmp_path: Path) -> None:
    worker = Worker(make_recipe(worker={"weights_wait_s": 0.1}), tmp_path, KafkaSettings(bootstrap="x:1"))
    worker.engines = {"policy": FakeEngine(3)}
    asyncio.run(worker._wait_for_weights(task(policy=9)))
    assert worker.counts["weights_late"] == 1
    asyncio.run(worker._wait_for_weights(task(policy=2)))  # older than what it holds: no wait at all
    assert worker.counts["weights_late"] == 1
