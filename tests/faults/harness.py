"""Faults done to a real `astraflow run`: finding and SIGKILLing its components, its supervisor
and its own broker, restarting that broker on its data directory, and draining the run to take
its ledger (astraflow/runner/ledger.py). Used by tests/faults and by `make chaos` (bench/chaos.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

import pytest
import yaml

from astraflow.broker import BrokerState
from astraflow.config import KafkaSettings
from astraflow.runner.ledger import Ledger, build
from tests.conftest import REPO, cli, run_cmd, subprocess_env
from tests.e2e.helpers import TINY, processes_of, trainer_steps

KINDS = ("worker", "streams", "trainer", "feed")
BATCH_GROUPS = 2
# the marks of a test that faults a whole `astraflow run` (its timeout: a loaded 2-core machine)
RUN_MARKS = [
    pytest.mark.faults,
    pytest.mark.e2e,
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.timeout(1800),
]


class RunProcess(subprocess.Popen[str]):
    """An `astraflow run` of `start_run`, with the file its output goes to."""

    output_file: IO[str]


def start_run(recipe: Path, run_dir: Path, env: dict[str, str], *args: str) -> RunProcess:
    """`astraflow run` with its output in a file next to the run directory (`finish` reads it): a
    pipe nobody reads while the run goes on fills up, and the supervisor then blocks writing to it
    (crash events carry log tails), which looks exactly like a stall."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    out = open(run_dir.parent / f"{run_dir.name}-{time.time_ns()}.out", "w+")  # noqa: SIM115 - closed by finish
    proc = RunProcess(
        run_cmd(recipe, run_dir, *args),
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )
    proc.output_file = out
    return proc


def stop(proc: RunProcess, timeout: float) -> str:
    """Ctrl-C the run unless it has exited already, and `finish` it: its output."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    return finish(proc, timeout)


def finish(proc: RunProcess, timeout: float) -> str:
    """Wait for a run of `start_run` to exit (SIGINT, then fail, after `timeout`); its output."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=180)
        raise AssertionError(
            f"astraflow run did not finish in {timeout:.0f}s:\n{output(proc)[-5000:]}"
        ) from None
    return output(proc)


def output(proc: RunProcess) -> str:
    out = proc.output_file
    out.flush()
    return Path(out.name).read_text(errors="replace")


def component_pids(run_dir: Path, kind: str) -> list[int]:
    """PIDs of the run's `astraflow <kind>` processes (worker, streams, trainer, feed)."""
    return [pid for pid, cmd in processes_of(run_dir) if f"astraflow.cli {kind} " in cmd]


def kill_component(run_dir: Path, kind: str, timeout: float = 120.0) -> int:
    """SIGKILL one running `kind` process of the run (waiting for one to be up); its PID."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = component_pids(run_dir, kind)
        if pids:
            os.kill(pids[0], signal.SIGKILL)
            return pids[0]
        time.sleep(0.5)
    raise AssertionError(f"no {kind} process of {run_dir} ran within {timeout:.0f}s")


def broker_state(data_dir: Path) -> dict[str, Any]:
    """The broker of `data_dir` as `astraflow broker start` saved it (pid, port, bootstrap)."""
    state = BrokerState.load(data_dir)
    assert state is not None, f"no broker runs in {data_dir}"
    return asdict(state)


def kill_broker(data_dir: Path) -> int:
    """SIGKILL the broker of `data_dir` (its JVM, by the PID it saved)."""
    pid = int(broker_state(data_dir)["pid"])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return pid


def restart_broker(data_dir: Path) -> str:
    """`astraflow broker start` on `data_dir` and its port: the clients reconnect by themselves."""
    port = int(broker_state(data_dir)["port"])
    out = subprocess.run(
        cli("broker", "start", "--port", str(port), "--data-dir", str(data_dir), "--timeout", "900"),
        capture_output=True,
        text=True,
        timeout=960,
        cwd=REPO,
        env=subprocess_env(),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def fault_recipe(path: Path, workers: int = 1) -> Path:
    """The recipe every fault run uses: arithmetic with the tiny model, groups of 4, BATCH_GROUPS a
    step, a checkpoint at every step (each trainer failpoint has a step to hit, and a crash
    between a version's announcement and its checkpoint loses that version), no step limit (the
    faults decide when it ends)."""
    return write_recipe(
        path,
        REPO / "recipes" / "arithmetic.yaml",
        model=TINY,
        worker={"count": workers},
        feeder={"group_size": 4},
        trainer={"batch_groups": BATCH_GROUPS, "checkpoint_every": 1},
        run={"max_steps": None},
    )


def write_recipe(path: Path, base: Path, **overrides: Any) -> Path:
    """A copy of the recipe file `base` with nested overrides."""
    data = yaml.safe_load(base.read_text())
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = value
    path.write_text(yaml.safe_dump(data))
    return path


def settings_of(run_dir: Path, env: dict[str, str]) -> KafkaSettings:
    """How to reach the run's topics: the shared broker of `env`, or the run's own."""
    if env.get("ASTRAFLOW_BOOTSTRAP"):
        return KafkaSettings(bootstrap=env["ASTRAFLOW_BOOTSTRAP"], namespace=env.get("ASTRAFLOW_NAMESPACE"))
    return KafkaSettings(bootstrap=broker_state(run_dir / "broker")["bootstrap"])


def catches_sigterm(pid: int) -> bool:
    """Whether process `pid` has installed its SIGTERM handler (SigCgt in /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:")), 0)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def drain(
    run_dir: Path,
    proc: RunProcess,
    env: dict[str, str],
    policies: list[str],
    batch_groups: int,
    timeout: float = 600.0,
) -> Ledger:
    """Stop the feeder of the running run (SIGTERM: a clean exit, which the supervisor does not
    restart; again if a crashed one comes back), let every task in flight finish, and return the
    ledger once it is drained: nothing waits anywhere but fewer than a batch per policy in the
    trainer. The run keeps running; the ledger of an undrained run comes back after `timeout`."""
    ledger: Ledger | None = None
    deadline = time.monotonic() + timeout
    quiet = 0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"the run exited ({proc.returncode}) while draining:\n{finish(proc, 10)[-4000:]}"
            )
        feeders = component_pids(run_dir, "feed")
        for pid in feeders:
            if catches_sigterm(pid):  # before that, SIGTERM kills it: a crash, restarted
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        quiet = 0 if feeders else quiet + 1
        time.sleep(5)
        if quiet < 2:
            continue
        with contextlib.suppress(Exception):  # a broker that is restarting: try again
            ledger = build(run_dir, settings_of(run_dir, env), policies)
            if not ledger.problems(batch_groups, drained=True):
                return ledger
    if ledger is None:
        raise AssertionError(f"no ledger of {run_dir} could be taken within {timeout:.0f}s")
    return ledger


def wait_steps(run_dir: Path, policy: str, target: int, proc: RunProcess, timeout: float) -> float:
    """Wait until the trainer of `policy` reports `target` steps; the seconds it took. A stall (no
    such step in `timeout`) or an exit of the run fails with the run's output."""
    start = time.monotonic()
    while trainer_steps(run_dir, policy) < target:
        if proc.poll() is not None:
            raise AssertionError(
                f"the run exited ({proc.returncode}) before step {target}:\n{finish(proc, 10)[-4000:]}"
            )
        if time.monotonic() - start > timeout:
            raise AssertionError(
                f"stall: step {target} not reached in {timeout:.0f}s (at {trainer_steps(run_dir, policy)})"
            )
        time.sleep(0.5)
    return time.monotonic() - start
