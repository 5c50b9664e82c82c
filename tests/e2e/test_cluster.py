"""A real 3-node KRaft cluster (`astraflow broker start --nodes 3`): topics replicated 3 ways with
min.insync.replicas 2, and a run that loses a broker to SIGKILL mid-run and still trains every
group exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from astraflow.broker import cluster
from tests.conftest import REPO, subprocess_env
from tests.e2e.helpers import endless_recipe, finish, run_env, start_run, summary, trainer_steps, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.slow]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "astraflow.cli", *args],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=REPO,
        env=subprocess_env(),
    )


def ledger(run_dir: Path, policy: str) -> list[dict[str, Any]]:
    path = run_dir / "trainer" / policy / "trained.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_3_node_cluster_loses_a_broker_mid_run_and_loses_nothing(tmp_path: Path) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource

    from astraflow import topics
    from astraflow.config import KafkaSettings
    from astraflow.kafka import make_admin

    data = tmp_path / "cluster"
    started = cli("broker", "start", "--nodes", "3", "--port", "0", "--data-dir", str(data))
    try:
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        state = cluster.ClusterState.load(data)
        assert state is not None and len(set(state.pids)) == 3
        assert started.stdout.strip().splitlines()[-1] == state.bootstrap
        for pid in state.pids:  # three JVMs, each with a small heap
            assert "-Xmx256m" in Path(f"/proc/{pid}/cmdline").read_bytes().decode()
        shown = cli("broker", "status", "--data-dir", str(data))
        assert shown.returncode == 0 and "3 of 3 brokers" in shown.stdout, shown.stdout + shown.stderr

        # the run's topics, created as `astraflow run` creates them under ASTRAFLOW_TOPICS_PROFILE
        env = run_env(state.bootstrap) | {"ASTRAFLOW_TOPICS_PROFILE": "replicated"}
        settings = KafkaSettings(bootstrap=state.bootstrap, namespace=env["ASTRAFLOW_NAMESPACE"])
        admin = make_admin(settings)
        topics.apply(admin, topics.expand(topics.load_spec(), ["solver"], settings, profile="replicated"))
        samples = settings.topic("samples.solver")
        names = (samples, settings.topic("trajectories"), settings.topic("weights"))

        min_isr: dict[str, str] = {}

        def replicated() -> bool:
            """Every partition with 3 replicas in sync, and each topic's configs readable: a broker
            learns of a new topic a moment after its creation (CI's describe_configs, 4 s after it,
            reached a broker that answered UNKNOWN_TOPIC_OR_PART)."""
            md = admin.list_topics(timeout=30)
            if not all(
                name in md.topics
                and md.topics[name].partitions
                and all(
                    len(p.replicas) == 3 and len(p.isrs) == 3 for p in md.topics[name].partitions.values()
                )
                for name in names
            ):
                return False
            try:
                for name in names:
                    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, name)])
                    min_isr[name] = next(iter(described.values())).result()["min.insync.replicas"].value
            except KafkaException:
                return False
            return True

        wait_for(replicated, 60, "every partition with 3 replicas in sync, its configs readable")
        assert min_isr == dict.fromkeys(names, "2")

        recipe = endless_recipe(tmp_path, workers=2)
        run_dir = tmp_path / "run"
        proc = start_run(recipe, run_dir, env, "--max-steps", "10")
        wait_for(
            lambda: trainer_steps(run_dir, "solver") >= 3 or proc.poll() is not None,
            900,
            "three trainer steps",
        )
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        # kill the broker that leads partition 0 of the trainer's input: its clients must fail over
        leader = admin.list_topics(samples, timeout=30).topics[samples].partitions[0].leader
        victim = state.pids[leader - 1]
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        out = finish(proc, 900)
        assert proc.returncode == 0, out[-5000:]
        assert "every trainer reached 10 steps" in out, out[-3000:]
        assert summary(run_dir)["policies"]["solver"]["steps"] >= 10

        entries = [e for e in ledger(run_dir, "solver") if e["trained"]]
        groups = [g for e in entries for g in e["groups"]]
        assert len(groups) == len(set(groups)), "a group was trained twice"
        # every step trained batch_groups groups (under EDF a batch also lists the wholly stale groups
        # it dropped in passing, whose samples count as stale below)
        assert len(entries) >= 10 and len(groups) >= 2 * len(entries)
        group_size = 8  # recipes/arithmetic.yaml feeder.group_size: no sample of a trained group went missing
        assert all(e["samples"] + e["stale"] == group_size * len(e["groups"]) for e in entries), entries
        assert any(e["time"] > killed_at for e in entries), "nothing was trained after the kill"

        down = cli("broker", "status", "--data-dir", str(data))
        assert down.returncode == 1 and f"node {leader}: " in down.stdout and "DOWN" in down.stdout, (
            down.stdout
        )
        again = cli(
            "broker", "start", "--nodes", "3", "--port", "0", "--data-dir", str(data)
        )  # restarts only the dead node
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        restarted = cluster.ClusterState.load(data)
        assert restarted is not None
        assert [p for i, p in enumerate(restarted.pids) if i != leader - 1] == [
            p for i, p in enumerate(state.pids) if i != leader - 1
        ]
        assert restarted.pids[leader - 1] != victim
    finally:
        stopped = cli("broker", "stop", "--data-dir", str(data))
    assert stopped.returncode == 0, stopped.stderr
    final = cluster.ClusterState.load(data)
    assert final is not None and not any(cluster.alive(final))
