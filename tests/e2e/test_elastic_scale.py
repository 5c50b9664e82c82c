"""Elastic rollout at scale, as users run it: `astraflow run` with no workers of its own, and rollout
workers (`astraflow worker`) started and stopped from outside while it runs: 1 -> 6 -> 2. The last
two are unlike (max_episodes 4 vs 1, the second's episodes twice as long). At the end, with the
feeder stopped, the ledger: every task fed was trained exactly once or counted as dropped under a
reason, and every episode arrived. Printed, not asserted: each worker's trajectories and the
partitions' rebalance pauses (bench/RESULTS.md, "Elastic workers": a consumer group shares work per
partition, so the fast worker of the pair need not do more).

Episodes are paced by the test-only failpoint ASTRAFLOW_WORKER_FAILPOINT=episode_delay_ms:N (a
sleep, no CPU), so that six workers fit on two cores and the run outlasts the scaling."""

from __future__ import annotations

import collections
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from astraflow.config import KafkaSettings
from astraflow.records import Task, Trajectory
from tests.conftest import REPO, worker_cmd
from tests.e2e.helpers import finish, recipe_copy, run_env, start_run, wait_for
from tests.workers.kafka_util import read_topic, read_trajectories

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.slow]

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}
GROUP = 4
#: worker -> (worker.max_episodes, episode delay in ms): up to (episodes / delay) episodes per second;
#: `fast` and `slow`, the pair that stays, differ 8-fold.
WORKERS = {
    "w0": (1, 1000),
    "w1": (2, 1000),
    "w2": (2, 1000),
    "w3": (2, 1000),
    "fast": (4, 500),
    "slow": (1, 1000),
}


# ---------------------------------------------------------------------- the ledger


def trained_groups(run_dir: Path, policy: str) -> list[str]:
    """Group ids of every batch the trainer trained (trainer/<policy>/trained.jsonl), repeats kept."""
    path = run_dir / "trainer" / policy / "trained.jsonl"
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [g for e in entries if e["trained"] for g in e["groups"]]


def untrained_batches(run_dir: Path, policy: str) -> list[dict[str, Any]]:
    path = run_dir / "trainer" / policy / "trained.jsonl"
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in entries if not e["trained"]]


def dropped_groups(run_dir: Path) -> collections.Counter[str]:
    """Groups streams dropped, by reason, from the last metrics of its instances (metrics.jsonl)."""
    last: dict[str, dict[str, float]] = {}
    path = run_dir / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("component") == "streams":
                last[row.get("id", "")] = row.get("values", row)
    out: collections.Counter[str] = collections.Counter()
    for values in last.values():
        for key in ("groups.dropped", "groups.timeout_dropped"):
            if values.get(key):
                out[key] += int(values[key])
    return out


def check_ledger(fed: list[str], trained: list[str], dropped: collections.Counter[str]) -> None:
    """Nothing lost, nothing duplicated: each fed group trained once, or dropped under a reason."""
    assert len(fed) == len(set(fed)), "a task was fed twice"
    repeats = [g for g, n in collections.Counter(trained).items() if n > 1]
    assert not repeats, f"groups trained twice: {repeats[:5]}"
    unknown = set(trained) - set(fed)
    assert not unknown, f"trained groups that were never fed: {sorted(unknown)[:5]}"
    missing = len(fed) - len(trained)
    assert missing == sum(dropped.values()), (
        f"{len(fed)} fed, {len(trained)} trained: {missing} unaccounted for; drops counted: {dict(dropped)}"
    )


# ---------------------------------------------------------------------- workers from outside


def start_worker(tmp_path: Path, run_dir: Path, env: dict[str, str], wid: str) -> subprocess.Popen[bytes]:
    """`astraflow worker` as a user starts one beside a run: same recipe (but its own max_episodes),
    run directory and Kafka."""
    episodes, delay_ms = WORKERS[wid]
    recipe = tmp_path / f"worker-{wid}.yaml"
    data = yaml.safe_load((tmp_path / "arithmetic.yaml").read_text())
    data["worker"]["max_episodes"] = episodes
    recipe.write_text(yaml.safe_dump(data))
    log = open(run_dir / f"outside-{wid}.log", "wb")  # noqa: SIM115 - the process owns it
    return subprocess.Popen(
        worker_cmd(recipe, run_dir, wid),
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        env=env
        | {
            "ASTRAFLOW_WORKER_FAILPOINT": f"episode_delay_ms:{delay_ms}",
            "ASTRAFLOW_LOG_LEVEL": "INFO",
            "OMP_NUM_THREADS": "1",
        },
    )


LINE = re.compile(
    r"^(\S+ \S+) INFO workers\.worker: worker (\S+) (assigned|revoked|stopping)(?: \[([\d, ]*)\])?"
    r"(?: \(released (\d+) tasks\))?"
)


def partition_moves(run_dir: Path) -> tuple[list[float], int]:
    """From the workers' logs: for each partition that changed hands, seconds from the moment its
    owner stopped taking its tasks (revocation, or SIGTERM: a stopping worker pauses its partitions
    while it drains) to its next assignment (the rebalance pause of that partition); and the tasks
    released to be re-run."""
    events: list[tuple[datetime.datetime, str, str, list[int]]] = []
    released = 0
    for log in run_dir.glob("outside-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            m = LINE.match(line)
            if m:
                when = datetime.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f")
                events.append((when, m[2], m[3], [int(p) for p in (m[4] or "").split(",") if p.strip()]))
                released += int(m[5] or 0)
    events.sort()
    held: dict[str, set[int]] = collections.defaultdict(set)
    idle_since: dict[int, datetime.datetime] = {}
    gaps = []
    for when, worker, what, parts in events:
        if what == "stopping":
            for p in held[worker]:
                idle_since.setdefault(p, when)
        for p in parts:
            if what == "revoked":
                held[worker].discard(p)
                idle_since.setdefault(p, when)
            else:
                held[worker].add(p)
                if p in idle_since:
                    gaps.append((when - idle_since.pop(p)).total_seconds())
    return gaps, released


def trajectories(kafka: KafkaSettings) -> list[Trajectory]:
    return read_trajectories(kafka)


def stop(procs: dict[str, subprocess.Popen[bytes]], names: list[str], run_dir: Path) -> None:
    for w in names:
        procs[w].send_signal(signal.SIGTERM)
    for w in names:
        code = procs[w].wait(90)
        assert code == 0, (
            f"worker {w} exited with {code}:\n{(run_dir / f'outside-{w}.log').read_text()[-3000:]}"
        )


def feeder_pid(run_dir: Path) -> int:
    started = re.findall(r"started feeder \(PID (\d+)\)", (run_dir / "events.log").read_text())
    return int(started[-1])


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def accounted(run_dir: Path) -> int:
    return len(trained_groups(run_dir, "solver")) + sum(dropped_groups(run_dir).values())


@pytest.mark.timeout(1800)  # about 4 minutes on an idle 2-core machine; a shared one is slower
def test_workers_scale_1_to_6_to_2_mid_run_and_nothing_is_lost(kafka_bootstrap: str, tmp_path: Path) -> None:
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    # the feeder runs on (admission: at most (2 + 1) x 2 x 1 = 6 groups ahead of the trainer) until
    # the test stops it: however slowly the workers start on a busy machine, tasks never run out
    recipe = recipe_copy(
        "arithmetic",
        tmp_path,
        model=TINY,
        feeder={"group_size": GROUP},
        worker={"count": 0, "max_episodes": 2, "metrics_every_s": 1.0, "drain_timeout_s": 20},
        trainer={"batch_groups": 1, "publish_every": 2},
        run={"max_steps": None},
    )
    run_dir = tmp_path / "run"
    env = run_env(kafka_bootstrap)
    kafka = KafkaSettings(bootstrap=kafka_bootstrap, namespace=env["ASTRAFLOW_NAMESPACE"])
    run = start_run(recipe, run_dir, env)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        wait_for(
            lambda: (run_dir / "init" / "solver" / "config.json").exists() or run.poll() is not None,
            600,
            "the run's initial checkpoint",
        )
        assert run.poll() is None, finish(run, 60)[-3000:]
        marks["run up"] = time.monotonic() - t0
        # 1: one worker
        procs["w0"] = start_worker(tmp_path, run_dir, env, "w0")
        wait_for(
            lambda: len(trained_groups(run_dir, "solver")) >= 2, 600, "two groups trained with one worker"
        )
        marks["1 worker"] = time.monotonic() - t0
        # 2: six workers
        for w in WORKERS:
            if w not in procs:
                procs[w] = start_worker(tmp_path, run_dir, env, w)
        wait_for(
            lambda: set(procs) <= {t.worker_id for t in trajectories(kafka)},
            900,
            "every one of six workers to roll out a task",
        )
        marks["6 workers each rolled out"] = time.monotonic() - t0
        # 3: back to two, the unlike pair
        stop(procs, ["w0", "w1", "w2", "w3"], run_dir)
        marks["down to 2"] = time.monotonic() - t0
        at_two = len(trained_groups(run_dir, "solver"))
        before = collections.Counter(t.worker_id for t in trajectories(kafka))
        wait_for(
            lambda: len(trained_groups(run_dir, "solver")) >= at_two + 8, 600, "8 groups trained by the pair"
        )
        # 4: no more tasks; everything fed must come out of the loop
        feeder = feeder_pid(run_dir)
        os.kill(feeder, signal.SIGTERM)  # it saves its position and exits 0: the supervisor lets it be
        wait_for(lambda: not alive(feeder), 120, "the feeder to stop")
        fed = [t.group_id for t in read_topic(kafka, "tasks") if isinstance(t, Task)]
        wait_for(
            lambda: accounted(run_dir) >= len(fed), 600, f"all {len(fed)} tasks fed to be trained or dropped"
        )
        marks["all accounted"] = time.monotonic() - t0
        stop(procs, ["fast", "slow"], run_dir)
        run.send_signal(signal.SIGINT)
        out = finish(run, 240)
        assert run.returncode == 0, out[-3000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        if run.poll() is None:
            run.kill()
            run.wait()
    assert "restarted feeder" not in (run_dir / "events.log").read_text()
    again = [t.group_id for t in read_topic(kafka, "tasks") if isinstance(t, Task)]
    assert sorted(fed) == sorted(again), "fed after the stop"  # partitions interleave in any order
    trained = trained_groups(run_dir, "solver")
    dropped = dropped_groups(run_dir)
    check_ledger(fed, trained, dropped)
    assert not untrained_batches(run_dir, "solver")
    trajs = trajectories(kafka)
    episodes = collections.Counter(t.worker_id for t in trajs)
    pair = {w: episodes[w] - before[w] for w in ("fast", "slow")}
    gaps, released = partition_moves(run_dir)
    print(
        f"\nelastic scale: {len(fed)} tasks; {marks}; trained before the scale-down {at_two}; trajectories "
        f"per worker {dict(episodes)}, by the pair after it {pair}; drops {dict(dropped)}; "
        f"{len(gaps)} partition moves, paused -> assigned s: median "
        f"{statistics.median(gaps) if gaps else 0:.2f}, max {max(gaps, default=0):.2f}; "
        f"{released} tasks released to be re-run"
    )
    assert all(episodes[w] > 0 for w in procs), episodes
    # every episode of every fed task arrived, once per traj_id (re-runs after a rebalance share ids)
    assert len({t.traj_id for t in trajs}) == len(fed) * GROUP
