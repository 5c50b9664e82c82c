"""Config of the rollout workers (`astraflow worker`). Owned by the workers component."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from astraflow.config.base import StrictModel


class EngineConfig(StrictModel):
    """Inference engine, chosen by `type`."""

    type: str = "torch"
    """`torch` (local transformers model) or `sglang` (HTTP client of an SGLang server)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Engine-specific arguments."""


class WorkerConfig(StrictModel):
    """What a rollout worker runs and how much at once."""

    workflow: str = "single_turn"
    """Registered workflow (episode program)."""
    engine: EngineConfig = EngineConfig()
    """Inference engine used for every role."""
    max_episodes: int = Field(default=16, ge=1, le=4096)
    """Episodes in flight at once in one worker."""
    count: int = Field(default=1, ge=0, le=256)
    """Workers `astraflow run` starts."""
    regions: list[str] = Field(default_factory=lambda: ["local"])
    """Regions `astraflow run` spreads its workers over (round robin)."""
