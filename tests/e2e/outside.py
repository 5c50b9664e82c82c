"""A run with rollout workers started from outside (`astraflow worker` beside `astraflow run`, paced
by the test-only failpoint ASTRAFLOW_WORKER_FAILPOINT=episode_delay_ms:N), and its ledger: every task
fed trained exactly once or counted as dropped under a reason. Shared by the elastic tests."""

from __future__ import annotations

import collections
import json
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import yaml

from astraflow.config import KafkaSettings
from astraflow.records import trajectories_of
from tests.conftest import REPO, worker_cmd
from tests.kafka_helpers import read_now

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
