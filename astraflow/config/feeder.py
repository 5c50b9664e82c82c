"""Config of the task feeder (`astraflow feed`). Owned by the workers component."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from astraflow.config.base import StrictModel


class FeederConfig(StrictModel):
    """Where tasks come from and how fast they are admitted."""

    env: str = "arithmetic"
    """Registered environment whose generator makes the tasks (ignored when `jsonl` is set)."""
    env_args: dict[str, Any] = Field(default_factory=dict)
    """Arguments of the environment's task generator."""
    jsonl: str | None = None
    """A JSONL file of tasks to feed instead of a generator."""
    group_size: int = Field(default=8, ge=1, le=4096)
    """Trajectories per task (the GRPO group)."""
    max_tasks: int | None = Field(default=None, ge=1)
    """Stop after this many tasks (None: run until stopped)."""
    seed: int = 0
    """Seed of the task generator."""
