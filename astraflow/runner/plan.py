"""What `astraflow run` starts: its options and the plan of its components (trainers, one per
policy; the streams worker; the rollout workers, spread over the recipe's regions; the feeder),
each with its command line, start stage, stop timeout and the thread counts its torch may use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from astraflow.config import Recipe
from astraflow.runner.supervisor import Component


@dataclass
class RunOptions:
    max_steps: int | None = None
    max_minutes: float | None = None
    run_dir: Path | None = None
    dashboard: bool = True
    workers: int | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    secure: bool = False
    """Start the local broker secured (SASL_SSL, SCRAM-SHA-512, ACLs) and give each component kind its
    own principal: see astraflow.broker.secure and astraflow.broker.acls."""


def run_dir_of(recipe: Recipe, override: Path | None = None) -> Path:
    return Path(override) if override else recipe.run_dir


def components(recipe: Recipe, recipe_path: Path, run_dir: Path, opts: RunOptions) -> list[Component]:
    common = ["--recipe", str(recipe_path), "--run-dir", str(run_dir)]
    out = []
    max_steps = opts.max_steps or recipe.run.max_steps
    for policy in recipe.policy_names:
        args = ["trainer", *common, "--policy", policy]
        if max_steps:
            args += ["--max-steps", str(max_steps)]
        out.append(Component(f"trainer-{policy}", args, stage=0, stop_timeout_s=120))
    out.append(
        Component("streams", ["streams", *common, "--data-dir", str(run_dir / "streams-data")], stage=1)
    )
    count = recipe.worker.count if opts.workers is None else opts.workers
    regions = recipe.worker.regions or ["local"]
    for i in range(count):
        region = regions[i % len(regions)]
        out.append(
            Component(
                f"worker-{i}",
                ["worker", *common, "--region", region, "--id", f"worker-{i}"],
                stage=2,
                stop_timeout_s=recipe.worker.drain_timeout_s + 30,
            )
        )
    out.append(Component("feeder", ["feed", *common], stage=3, stop_timeout_s=30))
    threads = torch_threads(len(recipe.policy_names) + count)
    for c in out:
        c.env.update(threads)
    return out


def torch_threads(torch_processes: int) -> dict[str, str]:
    """Thread-count variables that share this machine's cores among the run's torch processes
    (trainers and workers). Left alone when the user set OMP_NUM_THREADS. Otherwise every process
    would start one torch thread per core, and on a small machine they and the broker would fight
    for the same cores: on 2 cores with 2 workers and a trainer that took 1.5x longer."""
    if "OMP_NUM_THREADS" in os.environ:
        return {}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    n = str(max(1, cores // max(1, torch_processes)))
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}
