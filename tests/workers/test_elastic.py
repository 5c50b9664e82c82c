"""Elastic rollout against the real broker, with real `astraflow worker` processes:
two workers in one group share the tasks of one topic; a third that joins mid-run takes partitions;
a worker killed with SIGKILL mid-episode leaves no task without its trajectories (its tasks are
re-run elsewhere, with the same deterministic traj_ids)."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from astraflow.config import KafkaSettings
from astraflow.records import Trajectory, trajectories_of
from tests.kafka_helpers import read_now

from ..conftest import subprocess_env, worker_cmd
from .conftest import TINY
from .kafka_util import committed, end_offsets, read_topic

pytestmark = [pytest.mark.broker, pytest.mark.slow]

FIRST, SECOND, GROUP = 24, 48, 2
EPISODE_MS = 1000
TASKS = FIRST + SECOND


def start_worker(recipe: Path, run_dir: Path, wid: str, log_dir: Path) -> subprocess.Popen[bytes]:
    log = open(log_dir / f"{wid}.log", "wb")  # noqa: SIM115 - the process owns it
    return subprocess.Popen(
        worker_cmd(recipe, run_dir, wid, "--region", f"r-{wid}"),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=subprocess_env(
            ASTRAFLOW_LOG_LEVEL="INFO", ASTRAFLOW_WORKER_FAILPOINT=f"episode_delay_ms:{EPISODE_MS}"
        ),
    )


def wait_for(kafka: KafkaSettings, cond: Any, timeout: float) -> list[Trajectory]:
    deadline = time.monotonic() + timeout
    while True:
        # up to the end offsets now: read_trajectories reads on until the topic is quiet for 2 s (up
        # to 30 s in a busy run), long enough for the run to finish before the kill it waits for
        trajs = [t for r in read_now(kafka, "trajectories") for t in trajectories_of(r)]
        if cond(trajs) or time.monotonic() > deadline:
            return trajs
        time.sleep(0.5)


def rebalances(log_dir: Path) -> dict[str, list[str]]:
    """Each worker's assignment and revocation lines, for a failure's message."""
    return {
        log.stem: [
            line.split(": ", 1)[-1]
            for line in log.read_text().splitlines()
            if "assigned" in line or "revoked" in line
        ]
        for log in sorted(log_dir.glob("*.log"))
    }


def test_workers_share_join_and_survive_sigkill(kafka: KafkaSettings, topics: Any, tmp_path: Path) -> None:
    from workers.feeder import Feeder

    from .conftest import make_recipe

    topics(["policy"])
    # the code environment runs every program that compiles in a sandbox subprocess and a simulated
    # remote judge adds 2 s to it, but an untrained policy's programs mostly do not compile (scored
    # at once); every episode holds its slot EPISODE_MS: the run cannot finish before the third
    # worker has joined and the kill (72 tasks x 2 on at most 12 episodes at a time is at least 12 s)
    data = {
        "name": "elastic",
        "model": dict(TINY),
        "kafka": kafka.model_dump(exclude_none=True),
        "feeder": {
            "env": "code",
            "group_size": GROUP,
            "admission": False,
            "max_tasks": FIRST,
            "env_args": {"max_tokens": 16, "judge_latency_s": 2.0},
        },
        "worker": {"max_episodes": 4, "metrics_every_s": 1.0, "drain_timeout_s": 20},
    }
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(data))
    run_dir = tmp_path / "run"
    recipe = make_recipe(**{k: v for k, v in data.items() if k != "name"})
    assert Feeder(recipe, run_dir, kafka).run() == FIRST
    logs = tmp_path / "logs"
    logs.mkdir()
    procs = {w: start_worker(recipe_path, run_dir, w, logs) for w in ("a", "b")}
    try:
        # 1. two workers share the topic
        trajs = wait_for(kafka, lambda ts: {"a", "b"} <= {t.worker_id for t in ts}, 120)
        by_worker = collections.Counter(t.worker_id for t in trajs)
        assert by_worker["a"] > 0 and by_worker["b"] > 0, by_worker
        # 2. a third joins mid-run and takes partitions
        procs["c"] = start_worker(recipe_path, run_dir, "c", logs)
        deadline = time.monotonic() + 120
        while "assigned [" not in (logs / "c.log").read_text().replace("assigned []", ""):
            assert time.monotonic() < deadline, "the third worker never joined"
            time.sleep(0.5)
        # more tasks now: the feeder resumes its generator where it stopped (no task fed twice)
        more = recipe.model_copy(update={"feeder": recipe.feeder.model_copy(update={"max_tasks": SECOND})})
        assert Feeder(more, run_dir, kafka).run() == SECOND
        # kill while the second batch is being worked on (whether the third worker ran tasks is
        # checked at the end: waiting here for its first trajectory let the run finish first)
        trajs = wait_for(kafka, lambda ts: sum(t.worker_id == "a" for t in ts) > by_worker["a"], 120)
        done_before_kill = len({t.group_id for t in trajs})
        assert done_before_kill < TASKS, "the run finished before the kill: make episodes slower"
        assert len({t.group_id for t in read_topic(kafka, "tasks")}) == TASKS
        # 3. SIGKILL one mid-run: whatever it held is re-run by the others
        procs["a"].send_signal(signal.SIGKILL)
        procs["a"].wait(10)

        def complete(ts: list[Trajectory]) -> bool:
            ids: dict[str, set[str]] = collections.defaultdict(set)
            for t in ts:
                ids[t.group_id].add(t.traj_id)
            return len(ids) == TASKS and all(len(v) == GROUP for v in ids.values())

        trajs = wait_for(kafka, complete, 240)
        assert complete(trajs), (
            f"{len({t.group_id for t in trajs})} of {TASKS} tasks have all their trajectories; "
            f"the workers' partitions: {rebalances(logs)}"
        )
        for w in ("b", "c"):
            procs[w].send_signal(signal.SIGTERM)
        for w in ("b", "c"):
            assert procs[w].wait(60) == 0, (logs / f"{w}.log").read_text()[-2000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    counts = collections.Counter(t.worker_id for t in trajs)
    duplicates = len(trajs) - len({t.traj_id for t in trajs})
    print(
        f"\nelastic: {TASKS} tasks x {GROUP}: trajectories per worker {dict(counts)}, "
        f"{duplicates} duplicates (re-runs after the kill/rebalances), "
        f"{done_before_kill} tasks done before the kill"
    )
    # re-runs carry the same ids: downstream dedupe leaves exactly TASKS x GROUP trajectories
    assert len({t.traj_id for t in trajs}) == TASKS * GROUP
    assert counts["b"] > 0 and counts["c"] > 0, f"the third worker ran no task: {dict(counts)}"
    # the survivors committed everything
    ends = end_offsets(kafka, "tasks")
    assert committed(kafka, "workers", "tasks") == {p: (o if o > 0 else -1001) for p, o in ends.items()}
    assert os.path.exists(run_dir / "init" / "policy" / "config.json")
