"""Config of the task feeder (`astraflow feed`). Owned by the workers component."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from astraflow.config.base import StrictModel


class SelectiveConfig(StrictModel):
    """Selective rollout: skip tasks whose statistics say they teach nothing."""

    enabled: bool = False
    """Read `task-stats` and skip tasks that are always or never solved."""
    min_groups: int = Field(default=2, ge=1)
    """Groups a task needs before its statistics are trusted."""
    solved_above: float = Field(default=0.99, ge=0.0, le=1.0)
    """A task whose success rate is at least this is `always solved`."""
    unsolved_below: float | None = Field(default=0.01, ge=0.0, le=1.0)
    """A task whose success rate is at most this is `never solved`. None: never-solved tasks are
    always fed (a task whose first success needs exploration, e.g. the two-digit sums of the full
    addition task, teaches nothing until it is found)."""
    keep_fraction: float = Field(default=0.1, ge=0.0, le=1.0)
    """Floor: this fraction of skippable tasks is fed anyway (their statistics can change)."""
    max_skips_in_row: int = Field(default=32, ge=1)
    """Floor: after this many skips in a row the next task is fed whatever its statistics."""


class FeederConfig(StrictModel):
    """Where tasks come from and how fast they are admitted."""

    env: str = "arithmetic"
    """Registered environment whose generator makes the tasks (ignored when `jsonl` is set)."""
    env_args: dict[str, Any] = Field(default_factory=dict)
    """Arguments of the environment (its generator, and its scoring at the workers)."""
    jsonl: str | None = None
    """A JSONL file of tasks to feed instead of a generator (one JSON object a line: env, prompt,
    payload, optional task_id, seed, roles, group_size)."""
    group_size: int = Field(default=8, ge=1, le=4096)
    """Episodes per task (the GRPO group)."""
    roles: dict[str, str] | None = None
    """Role -> policy of every task; None: the workflow's roles over the recipe's policies in order."""
    max_tasks: int | None = Field(default=None, ge=1)
    """Stop after this many tasks (None: run until stopped)."""
    seed: int = 0
    """Seed of the task generator (and part of every task id)."""
    admission: bool = True
    """Keep at most (max_staleness + 1) x trainer.publish_every x trainer.batch_groups groups ahead of
    the slowest trainer (more would be stale when trained), or `ahead_groups`."""
    ahead_groups: int | None = Field(default=None, ge=1)
    """A smaller admission window, in groups (None: the staleness bound's). Where the trainer is the
    slowest stage, every sample waits in the pipeline until it is `max_staleness` versions old; a
    smaller window trains fresher samples, and slows the run once it holds fewer groups than the
    pipeline's latency needs (bench/RESULTS.md, "A smaller admission window"). A larger value is the
    bound's window (a recipe copied with smaller batches keeps its bound); one below
    `trainer.batch_groups` is refused."""
    selective: SelectiveConfig = SelectiveConfig()
    """Selective rollout from `task-stats`."""
    poll_s: float = Field(default=0.2, gt=0.0, le=60.0)
    """How often a blocked feeder re-reads trainer progress."""
    routing: Literal["least_outstanding", "task_id"] = "least_outstanding"
    """Which partition of `tasks` a task goes to: `least_outstanding`, one of the worker with the
    fewest tasks published and not yet done (so faster workers get more: workers/routing.py), or
    `task_id`, by the hash of its key (every partition the same share, whoever owns it)."""
    routing_refresh_s: float = Field(default=0.2, gt=0.0, le=60.0)
    """How often `least_outstanding` re-reads the workers' committed offsets (one request)."""
    max_task_stats: int = Field(default=100_000, ge=1)
    """TaskStats kept in memory for selective rollout (least recently updated evicted first; the
    evictions are counted in feeder.stats_evicted). Groups that reached no trainer stay counted."""
