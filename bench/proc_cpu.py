"""CPU of each component of a run, per trainer step, from /proc (Linux).

`watch` snapshots the CPU time (user + system, all threads) of the run's processes, by kind (the
`astraflow.cli` subcommand, or the broker JVM), and the machine's idle time, once when the trainer
reaches step A and once at step B; `StepCpu` is the difference divided by B - A: what a step costs
each component, and what the run left of the cores. On a machine the run keeps busy, a step's wall
time is their sum over the cores. `measured_run` runs `astraflow run` and watches it.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.helpers import TrainerSteps, processes_of

KINDS = ("trainer", "streams", "worker", "feed", "run")
HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def kind_of(cmd: str, workers_apart: bool = False) -> str:
    """The component a command line runs: broker, trainer, streams, worker, feed, run or other.
    `workers_apart`: a worker as `worker <id>`, each on its own."""
    if "kafka.Kafka" in cmd:
        return "broker"
    for kind in KINDS:
        if f"astraflow.cli {kind} " in cmd:
            if kind == "worker" and workers_apart and "--id " in cmd:
                return f"worker {cmd.split('--id ')[1].split()[0]}"
            return kind
    return "other"


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of every thread of `pid` so far (None: it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / HZ


def idle_seconds() -> float:
    """Idle (and I/O wait) seconds of all the machine's cores together since boot."""
    values = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return (int(values[3]) + int(values[4])) / HZ


@dataclass
class Snapshot:
    step: int
    at: float
    idle: float
    cpu: dict[int, tuple[str, float]] = field(default_factory=dict)  # pid -> (kind, seconds)


def snapshot(step: int, run_dir: Path, extra: dict[int, str]) -> Snapshot:
    """CPU of the processes of `run_dir` and of `extra` ({pid: kind}, e.g. a broker of its own)."""
    snap = Snapshot(step, time.time(), idle_seconds())
    for pid, kind in [*((p, kind_of(c)) for p, c in processes_of(run_dir)), *extra.items()]:
        seconds = cpu_seconds(pid)
        if seconds is not None:
            snap.cpu[pid] = (kind, seconds)
    return snap


@dataclass
class StepCpu:
    """Milliseconds a step of CPU by kind (processes alive at both ends), the machine's idle
    milliseconds a step, and the wall milliseconds a step, between two snapshots."""

    first: int
    last: int
    wall_ms: float
    idle_ms: float
    by_kind: dict[str, float]

    @classmethod
    def between(cls, a: Snapshot, b: Snapshot) -> StepCpu:
        steps = max(1, b.step - a.step)
        by_kind: dict[str, float] = {}
        for pid, (kind, end) in b.cpu.items():
            if pid in a.cpu:
                by_kind[kind] = by_kind.get(kind, 0.0) + 1000 * (end - a.cpu[pid][1]) / steps
        return cls(
            a.step,
            b.step,
            1000 * (b.at - a.at) / steps,
            1000 * (b.idle - a.idle) / steps,
            dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        )

    @property
    def total_ms(self) -> float:
        return sum(self.by_kind.values())


def watch(
    run_dir: Path,
    step_of: Callable[[], int],
    first: int,
    last: int,
    done: Callable[[], bool],
    extra: dict[int, str] | None = None,
    poll_s: float = 0.1,
) -> StepCpu | None:
    """Wait for the trainer (`step_of`) to pass `first`, then `last`, and return the CPU between;
    None if the run ends (`done`) before it gets there."""
    snaps = []
    for target in (first, last):
        while (step := step_of()) < target:
            if done():
                return None
            time.sleep(poll_s)
        snaps.append(snapshot(step, run_dir, extra or {}))
    return StepCpu.between(*snaps)


def measured_run(
    argv: list[str],
    run_dir: Path,
    policy: str,
    steps: int,
    cwd: Path,
    env: dict[str, str] | None = None,
    extra: dict[int, str] | None = None,
) -> tuple[float, StepCpu | None]:
    """Run `astraflow run`'s `argv` (of `steps` steps into `run_dir`) to its end: its wall seconds,
    and the CPU a step of its components between steps N/5 and 4N/5 (and of `extra`'s processes;
    None if the run ended before). Raises CalledProcessError if the run fails."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        cpu = watch(
            run_dir,
            TrainerSteps(run_dir, policy),
            max(2, steps // 5),
            max(3, 4 * steps // 5),
            done=lambda: proc.poll() is not None,
            extra=extra,
        )
        code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if code:
        raise subprocess.CalledProcessError(code, argv)
    return time.perf_counter() - start, cpu
