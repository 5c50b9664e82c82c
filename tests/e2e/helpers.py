"""Running `astraflow run` as a user would, against the test session's broker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO, run_cmd, subprocess_env
from tests.kafka_helpers import wait_for  # noqa: F401 - the e2e tests import it from here

#: the model of the test runs: tiny, so that a run on a loaded 2-core machine takes minutes
TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}


def endless_recipe(tmp_path: Path, workers: int = 1, **trainer: Any) -> Path:
    """arithmetic with the TINY model, `workers` workers, 2 groups a step (and `trainer` settings)
    and no step limit: the test ends the run (Ctrl-C, a kill, `--max-steps`)."""
    return recipe_copy(
        "arithmetic",
        tmp_path,
        model=TINY,
        worker={"count": workers},
        trainer={"batch_groups": 2, **trainer},
        run={"max_steps": None},
    )


def recipe_copy(name: str, tmp_path: Path, **overrides: Any) -> Path:
    """A copy of recipes/<name>.yaml with nested overrides (`trainer={"lr": 1e-3}`)."""
    data = yaml.safe_load((REPO / "recipes" / f"{name}.yaml").read_text())
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_env(bootstrap: str) -> dict[str, str]:
    return subprocess_env(ASTRAFLOW_BOOTSTRAP=bootstrap, ASTRAFLOW_NAMESPACE=f"e2e{uuid.uuid4().hex[:8]}")


def start_run(recipe: Path, run_dir: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        run_cmd(recipe, run_dir, *args),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )


def finish(proc: subprocess.Popen[str], timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=180)
        raise AssertionError(f"astraflow run did not finish in {timeout:.0f}s:\n{out[-5000:]}") from None
    return out


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def processes_of(run_dir: Path) -> list[tuple[int, str]]:
    """Live processes whose command line mentions the run directory (ours: components, broker)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if str(run_dir) in cmd and state != "Z":
            found.append((int(proc.name), cmd))
    return found


class TrainerSteps:
    """The newest step of a policy's trainer in a run's metrics.jsonl, reading only what was
    appended since the last call (a poll that re-read the whole file cost the machine the bench
    measures more CPU as the run went on)."""

    def __init__(self, run_dir: Path, policy: str) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.marker = f'"trainer.{policy}"'.encode()
        self.offset = 0
        self.rest = b""
        self.step = 0

    def __call__(self) -> int:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = self.rest + fh.read()
        except OSError:
            return self.step
        self.offset += len(data) - len(self.rest)
        *lines, self.rest = data.split(b"\n")
        for line in lines:
            if self.marker in line:
                try:
                    self.step = max(self.step, int(json.loads(line)["step"]))
                except (ValueError, KeyError, TypeError):
                    continue
        return self.step


def trainer_steps(run_dir: Path, policy: str) -> int:
    """The newest step of `policy`'s trainer in the run's metrics.jsonl so far (0: none yet)."""
    return TrainerSteps(run_dir, policy)()
