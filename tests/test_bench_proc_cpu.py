"""Per-component CPU of a run (bench/proc_cpu.py): which process is which, what a step costs each,
measured on real processes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import proc_cpu
from bench.proc_cpu import Snapshot, StepCpu, kind_of
from tests.e2e.helpers import TrainerSteps, trainer_steps


@pytest.mark.parametrize(
    ("cmd", "kind", "apart"),
    [
        (
            "/venv/bin/python -m astraflow.cli trainer --recipe r.yaml --run-dir /tmp/run --policy solver",
            "trainer",
            "trainer",
        ),
        (
            (
                "/venv/bin/python -m astraflow.cli worker --recipe r.yaml --run-dir /tmp/run "
                "--region local --id worker-0"
            ),
            "worker",
            "worker worker-0",
        ),
        ("/venv/bin/python -m astraflow.cli feed --recipe r.yaml --run-dir /tmp/run", "feed", "feed"),
        ("/venv/bin/python -m astraflow.cli run r.yaml --run-dir /tmp/run --no-dashboard", "run", "run"),
        ("java -Xmx1g -cp /x kafka.Kafka /tmp/run/broker/server.properties", "broker", "broker"),
        ("/bin/sh -c sleep 1 /tmp/run", "other", "other"),
    ],
)
def test_processes_are_told_apart_by_their_command_line(cmd: str, kind: str, apart: str) -> None:
    assert kind_of(cmd) == kind
    assert kind_of(cmd, workers_apart=True) == apart


def test_a_step_costs_each_kind_its_share_of_the_cpu_between_two_snapshots() -> None:
    a = Snapshot(10, 100.0, 50.0, {1: ("trainer", 5.0), 2: ("worker", 2.0), 3: ("worker", 1.0)})
    b = Snapshot(20, 101.0, 50.2, {1: ("trainer", 5.6), 2: ("worker", 2.3), 3: ("worker", 1.1)})
    a.cpu[4] = ("feed", 1.0)
    b.cpu[5] = ("run", 9.0)
    cost = StepCpu.between(a, b)
    assert (cost.first, cost.last) == (10, 20)
    assert cost.wall_ms == pytest.approx(100.0) and cost.idle_ms == pytest.approx(20.0)
    # the feeder ended and the runner began inside the window: neither is counted
    assert cost.by_kind == pytest.approx({"trainer": 60.0, "worker": 40.0})
    assert list(cost.by_kind) == ["trainer", "worker"] and cost.total_ms == pytest.approx(100.0)


SPIN = "import time\nend = time.time() + 30\nwhile time.time() < end: pass"


def test_a_busy_process_of_the_run_is_found_and_its_cpu_counted(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    busy = subprocess.Popen(
        [sys.executable, "-c", SPIN, "-m", "astraflow.cli", "streams", "--run-dir", str(run_dir)]
    )
    try:
        steps = iter(range(1_000))
        cost = proc_cpu.watch(run_dir, lambda: next(steps), 5, 25, done=lambda: False, poll_s=0.02)
    finally:
        busy.kill()
        busy.wait()
    assert cost is not None
    # a process spinning on one core: ~20 ms of CPU per 20 ms "step" on an idle machine (a clock
    # tick, 10 ms, is the grain; other tests may share the cores)
    assert cost.wall_ms > 10
    assert set(cost.by_kind) == {"streams"} and cost.by_kind["streams"] > 0.2 * cost.wall_ms


def test_a_run_that_ends_before_the_window_gives_no_measurement(tmp_path: Path) -> None:
    t0 = time.time()
    ended = lambda: time.time() - t0 > 0.2  # noqa: E731
    assert proc_cpu.watch(tmp_path, lambda: 3, 5, 10, done=ended, poll_s=0.01) is None


def test_the_trainer_step_is_read_from_what_was_appended_even_mid_line(tmp_path: Path) -> None:
    steps = TrainerSteps(tmp_path, "solver")
    assert steps() == 0  # no metrics yet
    path = tmp_path / "metrics.jsonl"
    line = '{{"component": "trainer", "id": "trainer.{p}", "step": {s}, "values": {{}}}}\n'
    path.write_text(line.format(p="solver", s=3) + line.format(p="verifier", s=9))
    assert steps() == 3
    half = line.format(p="solver", s=4)
    with open(path, "a") as fh:
        fh.write(half[:20])
    assert steps() == 3  # a line being written is read once it ends
    with open(path, "a") as fh:
        fh.write(half[20:] + '{"id": "trainer.solver", broken\n')
    assert steps() == 4
    assert trainer_steps(tmp_path, "solver") == 4  # the one-shot read: the same lines, from the start


FAKE_RUN = """
import json, sys, time
from pathlib import Path
path = Path(sys.argv[1]) / "metrics.jsonl"
path.parent.mkdir(parents=True, exist_ok=True)
for step in range(1, 31):
    end = time.time() + 0.01
    while time.time() < end:
        pass
    with open(path, "a") as fh:
        fh.write(json.dumps({"component": "trainer", "id": "trainer.p", "step": step}) + "\\n")
sys.exit(int(sys.argv[2]))
"""


def test_a_measured_run_is_waited_for_and_its_failure_raised(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-c", FAKE_RUN, str(run_dir), "0"]
    wall, cost = proc_cpu.measured_run(argv, run_dir, "p", 30, tmp_path)
    assert cost is not None and (cost.first, cost.last) >= (6, 24) and wall > 0.3
    failing = [sys.executable, "-c", FAKE_RUN, str(tmp_path / "run2"), "3"]
    with pytest.raises(subprocess.CalledProcessError):
        proc_cpu.measured_run(failing, tmp_path / "run2", "p", 30, tmp_path)
