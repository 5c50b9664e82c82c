"""A worker against the real broker: tasks in, trajectories out, offsets committed only for tasks
whose trajectories were acknowledged, bad tasks dead-lettered, weights followed (a bad file refused)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from astraflow.config import KafkaSettings
from astraflow.kafka import Publisher
from astraflow.records import DeadLetter, Metric, Task, Trajectory, WeightVersion

from .conftest import make_recipe
from .kafka_util import committed, committed_tokens, end_offsets, read_topic, read_trajectories

pytestmark = pytest.mark.broker


def init_state(recipe: Any, run_dir: Path) -> dict[str, torch.Tensor]:
    from astraflow.models import init_checkpoint, load_model

    path = init_checkpoint(recipe.model_for("policy"), run_dir / "init" / "policy")
    return {k: v.clone() for k, v in load_model(path).state_dict().items()}


def fed(
    kafka: KafkaSettings, topics: Any, tmp_path: Path, group_size: int, tasks: int, drain_timeout_s: float
) -> tuple[Any, Path]:
    """A worker recipe over arithmetic tasks, and `tasks` of them already on the topic."""
    from workers.feeder import Feeder

    topics(["policy"])
    recipe = make_recipe(
        kafka=kafka.model_dump(),
        feeder={"env": "arithmetic", "group_size": group_size, "admission": False, "max_tasks": tasks},
        worker={
            "max_episodes": 4,
            "metrics_every_s": 0.5,
            "drain_timeout_s": drain_timeout_s,
            "max_queued_episodes": 0,
        },
    )  # takes tasks only for free slots: some are left
    run_dir = tmp_path / "run"
    assert Feeder(recipe, run_dir, kafka).run() == tasks
    return recipe, run_dir


def test_worker_end_to_end(kafka: KafkaSettings, topics: Any, tmp_path: Path) -> None:
    from astraflow.weights import WeightStore
    from workers.worker import Worker

    recipe, run_dir = fed(kafka, topics, tmp_path, group_size=3, tasks=6, drain_timeout_s=10)
    pub = Publisher(kafka)
    pub.send_raw("tasks", b"\x93not a record", key=b"junk")
    pub.send("tasks", Task(task_id="odd", env="no_such_env", roles={"agent": "policy"}), key="odd")
    pub.flush()
    # version 1 is published before the worker starts: it must be picked up from the compacted topic.
    # Its final norm is zero, so every generated token has log-prob exactly -log(vocab).
    state = init_state(recipe, run_dir)
    state["model.norm.weight"] = torch.zeros_like(state["model.norm.weight"])
    store = WeightStore(run_dir / "weights", "policy", snapshot_every=1)
    pub.send("weights", store.publish(state, 1, step=1), key="policy")
    pub.flush()

    worker = Worker(recipe, run_dir, kafka, worker_id="w-e2e", region="test")
    trajs: list[Any] = []

    def watch() -> None:
        trajs.extend(read_trajectories(kafka, until=lambda r: len(r) >= 18, timeout=90))
        # now a corrupted version 2: the worker must refuse it and keep version 1
        bad = store.publish({k: v + 1.0 if v.is_floating_point() else v for k, v in state.items()}, 2, step=2)
        path = Path(bad.snapshot_uri.removeprefix("file://"))
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
        if bad.delta_uri:
            dpath = Path(bad.delta_uri.removeprefix("file://"))
            ddata = bytearray(dpath.read_bytes())
            ddata[-1] ^= 0xFF
            dpath.write_bytes(bytes(ddata))
        pub.send("weights", bad, key="policy")
        pub.flush()
        deadline = time.monotonic() + 30
        # the refusal, and both bad tasks consumed: the worker pauses while it has no room for
        # episodes, so they may come after every trajectory is out
        while time.monotonic() < deadline and (
            worker.follower.refused == 0 or worker.counts["deadletters"] < 2
        ):
            time.sleep(0.1)
        worker.loop.call_soon_threadsafe(worker.stop)

    async def main() -> None:
        watcher = threading.Thread(target=watch)
        task = asyncio.create_task(worker.run())
        while not hasattr(worker, "follower"):
            await asyncio.sleep(0.05)
        watcher.start()
        await task
        watcher.join()

    asyncio.run(main())
    assert len(trajs) == 18 and all(isinstance(t, Trajectory) for t in trajs)
    by_task: dict[str, set[str]] = {}
    for t in trajs:
        by_task.setdefault(t.task_id, set()).add(t.traj_id)
        assert t.worker_id == "w-e2e" and t.region == "test" and t.group_size == 3
        assert (t.versions[t.owner == 0] == 1).all()
        vocab = 100
        assert torch.allclose(
            torch.tensor(t.logprobs[t.owner == 0]), -torch.log(torch.tensor(float(vocab))), atol=1e-5
        )
    assert len(by_task) == 6 and all(len(v) == 3 for v in by_task.values())
    assert worker.follower.refused == 1 and worker.engines["policy"].version == 1
    assert "v2" in (worker.follower.last_error or "")
    # every task (the two bad ones too) is committed, and nothing beyond
    assert committed(kafka, "workers", "tasks") == {
        p: o for p, o in end_offsets(kafka, "tasks").items() if o > 0
    } | {p: -1001 for p, o in end_offsets(kafka, "tasks").items() if o == 0}
    # each commit names this worker process, which the feeder's routing groups its partitions by
    tokens = committed_tokens(kafka, "workers", "tasks")
    assert tokens and set(tokens.values()) == {worker.token} and worker.token.startswith("w-e2e#"), tokens
    dead = read_topic(kafka, "deadletter")
    assert len(dead) == 2 and all(isinstance(d, DeadLetter) for d in dead)
    assert any("no_such_env" in d.error and "known:" in d.error for d in dead)
    metrics = [m for m in read_topic(kafka, "metrics") if isinstance(m, Metric) and m.component == "worker"]
    last = metrics[-1].values
    assert last["worker.tasks_done"] == 6 and last["worker.deadletters"] == 2
    assert last["worker.weights_refused"] == 1 and last["worker.weight_version.policy"] == 1
    assert last["worker.tokens"] == sum(int((t.owner == 0).sum()) for t in trajs)
    assert any(isinstance(r, WeightVersion) for r in read_topic(kafka, "weights"))


def test_stop_drains_in_flight_tasks_to_completion(kafka: KafkaSettings, topics: Any, tmp_path: Path) -> None:
    """A stopped worker finishes the tasks it holds (within drain_timeout_s), waits for their
    trajectories' acknowledgements, commits them, and consumes nothing more."""
    from workers.worker import Worker

    recipe, run_dir = fed(kafka, topics, tmp_path, group_size=2, tasks=8, drain_timeout_s=60)
    worker = Worker(recipe, run_dir, kafka, worker_id="w-drain", region="test")
    held: set[tuple[int, int]] = set()

    async def main() -> None:
        task = asyncio.create_task(worker.run())
        while not getattr(worker, "tasks", None):
            await asyncio.sleep(0.01)
        held.update(worker.tasks)  # stop while these are running
        worker.stop()
        await task

    asyncio.run(main())
    assert held and worker.counts["tasks_released"] == 0, worker.counts
    done = worker.counts["tasks_done"]
    assert done >= len(held) and done < 8, worker.counts  # it stopped early, with nothing left half done
    trajs = read_trajectories(kafka, until=lambda r: len(r) >= 2 * done, timeout=30)
    assert len({t.task_id for t in trajs}) == done and len(trajs) == 2 * done
    assert sum(o for o in committed(kafka, "workers", "tasks").values() if o > 0) == done
