"""Config of the streams component (`astraflow streams`): the pipeline of data algorithms."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from astraflow.config.base import StrictModel


class StageConfig(StrictModel):
    """One data algorithm of the pipeline, by registered name, with its arguments."""

    name: str
    """Registered algorithm (built-in or plug-in from the `astraflow.algorithms` entry points)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Arguments of the algorithm."""


class StreamsConfig(StrictModel):
    """The ordered pipeline from `trajectories` to `samples.<policy>`."""

    pipeline: list[StageConfig] = Field(
        default_factory=lambda: [StageConfig(name=n) for n in ("validate", "group", "grpo", "route")]
    )
    """Algorithms applied in order."""
