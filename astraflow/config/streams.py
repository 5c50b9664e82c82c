"""Config of the streams component (`astraflow streams`): the pipeline of data algorithms and the
Faust worker that runs it. Owned by the streams component.

The pipeline is an ordered list of registered algorithms with their arguments; it must start with
`validate` and `group` and end with `route`. Names and arguments are checked when the streams
worker builds the pipeline (`streams.pipeline.build_pipeline`), because plug-ins are found through
entry points that this light config module does not import.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from astraflow.config.base import StrictModel


class StageConfig(StrictModel):
    """One data algorithm of the pipeline, by registered name, with its arguments."""

    name: str
    """Registered algorithm (built-in or plug-in from the `astraflow.algorithms` entry points)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Arguments of the algorithm (keyword arguments of its constructor)."""


def _default_pipeline() -> list[StageConfig]:
    return [StageConfig(name=n) for n in ("validate", "group", "task_stats", "errored", "grpo", "route")]


class StreamsConfig(StrictModel):
    """The ordered pipeline from `trajectories` to `samples.<policy>`, and its Faust worker."""

    pipeline: list[StageConfig] = Field(default_factory=_default_pipeline, min_length=3)
    """Algorithms applied in order: `validate`, `group`, then any group algorithms (filters, an
    advantage estimator, `task_stats`, `replay`/`mix`, plug-ins), then `route`."""
    app_id: str = "streams"
    """Faust application id and consumer group, namespaced with `kafka.namespace`."""
    data_dir: str | None = None
    """Faust data directory. Default: `$ASTRAFLOW_HOME/streams/<app id>` (outside the repository)."""
    web_port: int | None = Field(default=None, ge=1, le=65535)
    """Port of Faust's web server (statistics pages); None keeps it off."""
    sweep_every_s: float = Field(default=1.0, gt=0, le=60)
    """How often a timer looks for groups that timed out or completed without a new event."""
    metrics_every_s: float = Field(default=5.0, gt=0, le=3600)
    """How often the per-stage metrics are published to `metrics`."""
    commit_every_s: float = Field(default=2.0, gt=0, le=60)
    """How often consumed offsets are committed (after the producer is flushed)."""
    producer_linger_ms: int = Field(default=20, ge=0, le=1000)
    """How long the worker's producer holds records to batch them. Writes a group's emission
    waits for are sent at once regardless; the rest (table changelog writes, task statistics)
    share requests, which cut the broker's and the worker's CPU per trajectory."""
    max_task_stats: int = Field(default=100_000, ge=1)
    """Tasks whose running statistics the `task_stats` table keeps: past it, the least recently
    updated tenth is deleted (metric task_stats.evicted); a deleted task's statistics start again
    from zero if it comes back (the feeder treats that reset as a new count)."""
    max_cached_trajectories: int = Field(default=16_384, ge=1)
    """Decoded trajectories of pending groups kept in memory (least recently stored dropped first,
    metric cache.evicted); a dropped one is decoded again from the `bodies` table when needed."""
    log_level: str = "warn"
    """Faust worker log level: crit, error, warn, info or debug."""

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        if v not in ("crit", "error", "warn", "info", "debug"):
            raise ValueError(f"{v!r} is not one of crit, error, warn, info, debug")
        return v

    @field_validator("app_id")
    @classmethod
    def _app_id(cls, v: str) -> str:
        import re

        if not re.fullmatch(r"[A-Za-z0-9._\-]{1,100}", v):
            raise ValueError("may contain only letters, digits, '.', '_' and '-'")
        return v
