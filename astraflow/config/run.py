"""Config of `astraflow run`: limits and where the run's files go."""

from __future__ import annotations

from pydantic import Field

from astraflow.config.base import StrictModel


class RunConfig(StrictModel):
    """Limits of one end-to-end run."""

    max_steps: int | None = Field(default=None, ge=1)
    """Stop when every trainer has made this many steps."""
    max_minutes: float | None = Field(default=None, gt=0)
    """Stop after this wall time."""
    dir: str = "runs/{name}"
    """Run directory (checkpoints, weight store, metrics, report); `{name}` is the recipe name."""
