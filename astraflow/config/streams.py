"""Config of the streams component (`astraflow streams`): the pipeline of data algorithms, the
stages around it, and the Faust worker that runs it. Owned by the streams component.

Every group goes validate -> group -> pipeline -> route. `validate` and `group` are not data
algorithms (they work on records and on the group table) and `route` always ends the chain, so
they are sections of their own (`streams.validate`, `streams.group`); `streams.pipeline` lists
only the algorithms in between. Their names and arguments are checked when the streams worker
builds the pipeline (`streams.pipeline.build_pipeline`), because plug-ins are found through entry
points that this light config module does not import.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from astraflow.config.base import StrictModel

#: Stages that recipes used to list in `streams.pipeline`, and where their arguments went.
_MOVED = {
    "validate": "put its args under streams.validate",
    "group": "put its args under streams.group",
    "route": "it always follows the last one and takes no arguments: remove it",
}


class StageConfig(StrictModel):
    """One data algorithm of the pipeline, by registered name, with its arguments."""

    name: str
    """Registered algorithm (built-in or plug-in from the `astraflow.algorithms` entry points)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Arguments of the algorithm (keyword arguments of its constructor)."""

    @model_validator(mode="after")
    def _not_moved(self) -> StageConfig:
        if self.name in _MOVED:  # a recipe written before validate, group and route had sections
            message = f"{self.name!r} is no longer a pipeline stage; {_MOVED[self.name]}"
            raise PydanticCustomError("stage_moved", message)
        return self


class ValidateConfig(StrictModel):
    """What `validate` checks beyond the record codec (streams/validate.py)."""

    check_ids: bool = True
    """Refuse a trajectory whose group_id or traj_id is not the one derived from its task_id,
    attempt and sample_index."""
    check_key: bool = True
    """Refuse a record whose Kafka key is not its group_id (a group must stay on one partition)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Refuse a trajectory longer than this many tokens; None: no limit."""


class GroupConfig(StrictModel):
    """How `group` collects a group's trajectories (streams/grouping.py)."""

    timeout_s: float = Field(default=120.0, gt=0)
    """Seconds from a group's first trajectory after which it is emitted or dropped incomplete."""
    on_timeout: Literal["emit", "drop"] = "emit"
    """At the timeout: emit what the group holds (if at least `min_size`), or drop it (`timeout`)."""
    min_size: int = Field(default=1, ge=1)
    """Fewest trajectories a timed-out group is emitted with; fewer: it is dropped."""
    dedupe_ttl_s: float = Field(default=3600.0, ge=0)
    """Seconds an emitted group is remembered, so that late or repeated trajectories are dropped."""


def _default_pipeline() -> list[StageConfig]:
    return [StageConfig(name=n) for n in ("task_stats", "errored", "grpo")]


class StreamsConfig(StrictModel):
    """validate -> group -> the pipeline -> route, from `trajectories` to `samples.<policy>`, and
    the Faust worker that runs it."""

    # a recipe dumped (tests write one for a subprocess) must load again: its key is `validate`
    model_config = ConfigDict(**StrictModel.model_config, serialize_by_alias=True)

    validation: ValidateConfig = Field(default_factory=ValidateConfig, alias="validate")
    """The `validate` stage. Recipe key `validate`: a field of that name would shadow pydantic's
    `BaseModel.validate`."""
    group: GroupConfig = Field(default_factory=GroupConfig)
    """The `group` stage."""
    pipeline: list[StageConfig] = Field(default_factory=_default_pipeline, min_length=1)
    """Data algorithms applied in order to each group: filters, then one advantage estimator, with
    `task_stats`, `replay`/`mix` and plug-ins where they belong. `route` follows the last."""
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
    recovery_stall_s: float = Field(default=30.0, gt=0, le=3600)
    """How long faust's table recovery may go without reading a changelog record while records are
    left to read before the worker exits to be restarted (faust 0.15.3 can wait for ever there:
    streams/recovery_watch.py). A slow recovery that reads is never cut short."""
    fetch_max_wait_ms: int | None = Field(default=None, ge=1, le=30_000)
    """How long the broker may hold an empty fetch of the worker's consumer. None: 20 ms, or 500 with
    `kafka.wan`. aiokafka keeps one fetch in flight per broker and leaves out of it the partitions
    whose records the worker has not taken yet, so a record arriving on one of those waits for that
    fetch to end: at faust's own 1,500 ms, groups that followed a burst waited 0.3-0.9 s (the streams
    bench's p99 in 4 of 16 runs), at 20 ms every run's p99 stayed under 50 ms (bench/RESULTS.md)."""
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
