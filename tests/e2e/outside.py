"""A run with rollout workers started from outside (`astraflow worker` beside `astraflow run`, paced
by the test-only failpoint ASTRAFLOW_WORKER_FAILPOINT=episode_delay_ms:N), and its ledger: every task
fed trained exactly once or counted as dropped under a reason. Shared by the elastic tests:
`outside_run` starts `astraflow run` with no workers of its own and waits for its first checkpoint,
`OutsideRun.add_worker` starts one from outside, `OutsideRun.drain` stops the feeder and waits until
every task fed is accounted for, and `OutsideRun.check` is the ledger of the whole run."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from astraflow.config import KafkaSettings
from astraflow.records import Task, Trajectory, trajectories_of
from tests.conftest import REPO, worker_cmd
from tests.e2e.helpers import TINY, finish, recipe_copy, run_env, start_run, wait_for
from tests.kafka_helpers import read_now
from tests.workers.kafka_util import read_topic, read_trajectories

GROUP = 4  # episodes a task

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


def episodes_now(kafka: KafkaSettings) -> collections.Counter[str]:
    """Episodes per worker on `trajectories` up to its end offsets now (read_trajectories reads on
    until the topic is quiet for 2 s, which a busy run never is: 30 s late)."""
    return collections.Counter(
        t.worker_id for r in read_now(kafka, "trajectories") for t in trajectories_of(r)
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


# ---------------------------------------------------------------------- workers from outside


def start_worker(
    recipe: Path, run_dir: Path, env: dict[str, str], wid: str, max_episodes: int, delay_ms: int
) -> subprocess.Popen[bytes]:
    """`astraflow worker` as a user starts one beside a run: same recipe (but its own max_episodes),
    run directory and Kafka; each episode sleeps `delay_ms` first (no CPU)."""
    own = recipe.with_name(f"worker-{wid}.yaml")
    data = yaml.safe_load(recipe.read_text())
    data["worker"]["max_episodes"] = max_episodes
    own.write_text(yaml.safe_dump(data))
    log = open(run_dir / f"outside-{wid}.log", "wb")  # noqa: SIM115 - the process owns it
    return subprocess.Popen(
        worker_cmd(own, run_dir, wid),
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


def stop(procs: dict[str, subprocess.Popen[bytes]], names: list[str], run_dir: Path) -> None:
    for w in names:
        procs[w].send_signal(signal.SIGTERM)
    for w in names:
        code = procs[w].wait(90)
        assert code == 0, (
            f"worker {w} exited with {code}:\n{(run_dir / f'outside-{w}.log').read_text()[-3000:]}"
        )


# ---------------------------------------------------------------------- the run around them


def outside_recipe(tmp_path: Path, feeder: dict[str, Any] | None = None, **worker: Any) -> Path:
    """The arithmetic recipe on the tiny model with no workers of its own, a group a step and a
    version every two (admission: at most (2 + 1) x 2 x 1 = 6 groups ahead of the trainer); the
    feeder runs on until the test stops it, so tasks never run out however slowly workers start."""
    return recipe_copy(
        "arithmetic",
        tmp_path,
        model=TINY,
        feeder={"group_size": GROUP, **(feeder or {})},
        worker={"count": 0, "metrics_every_s": 1.0, "drain_timeout_s": 20, **worker},
        trainer={"batch_groups": 1, "publish_every": 2},
        run={"max_steps": None},
    )


@dataclass
class OutsideRun:
    recipe: Path
    run_dir: Path
    env: dict[str, str]
    kafka: KafkaSettings
    run: subprocess.Popen[str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def add_worker(self, wid: str, max_episodes: int, delay_ms: int) -> None:
        self.procs[wid] = start_worker(self.recipe, self.run_dir, self.env, wid, max_episodes, delay_ms)

    def trained(self) -> int:
        return len(trained_groups(self.run_dir, "solver"))

    def drain(self) -> list[str]:
        """Stop the feeder, wait until every task it fed is trained or dropped, stop the workers
        still running and the run (exit 0). Returns the group ids fed."""
        feeder = feeder_pid(self.run_dir)
        os.kill(feeder, signal.SIGTERM)  # it saves its position and exits 0: the supervisor lets it be
        wait_for(lambda: not alive(feeder), 120, "the feeder to stop")
        fed = [t.group_id for t in read_topic(self.kafka, "tasks") if isinstance(t, Task)]
        wait_for(
            lambda: accounted(self.run_dir) >= len(fed),
            600,
            f"all {len(fed)} tasks fed to be trained or dropped",
        )
        stop(self.procs, [w for w, p in self.procs.items() if p.poll() is None], self.run_dir)
        self.run.send_signal(signal.SIGINT)
        out = finish(self.run, 240)
        assert self.run.returncode == 0, out[-3000:]
        return fed

    def check(self, fed: list[str]) -> list[Trajectory]:
        """The ledger of the whole run; returns every trajectory."""
        assert "restarted feeder" not in (self.run_dir / "events.log").read_text()
        again = [t.group_id for t in read_topic(self.kafka, "tasks") if isinstance(t, Task)]
        assert sorted(fed) == sorted(again), "fed after the stop"  # partitions interleave in any order
        check_ledger(fed, trained_groups(self.run_dir, "solver"), dropped_groups(self.run_dir))
        assert not untrained_batches(self.run_dir, "solver")
        trajs = read_trajectories(self.kafka)
        # every episode of every fed task arrived, once per traj_id (re-runs after a rebalance share ids)
        assert len({t.traj_id for t in trajs}) == len(fed) * GROUP
        return trajs


@contextlib.contextmanager
def outside_run(recipe: Path, tmp_path: Path, bootstrap: str) -> Iterator[OutsideRun]:
    """`astraflow run` of `recipe` on the broker at `bootstrap`, up to its initial checkpoint; on
    the way out, whatever still runs (the run, its outside workers) is killed."""
    run_dir = tmp_path / "run"
    env = run_env(bootstrap)
    kafka = KafkaSettings(bootstrap=bootstrap, namespace=env["ASTRAFLOW_NAMESPACE"])
    this = OutsideRun(recipe, run_dir, env, kafka, start_run(recipe, run_dir, env))
    try:
        wait_for(
            lambda: (run_dir / "init" / "solver" / "config.json").exists() or this.run.poll() is not None,
            600,
            "the run's initial checkpoint",
        )
        assert this.run.poll() is None, finish(this.run, 60)[-3000:]
        yield this
    finally:
        procs: list[subprocess.Popen[Any]] = [*this.procs.values(), this.run]
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
