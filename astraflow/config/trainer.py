"""Config of the trainer (`astraflow trainer --policy P`). Owned by the trainer component."""

from __future__ import annotations

from pydantic import Field

from astraflow.config.base import StrictModel


class TrainerConfig(StrictModel):
    """Optimisation, batching and weight publication of one policy's trainer."""

    lr: float = Field(default=1e-4, gt=0)
    """AdamW learning rate."""
    batch_groups: int = Field(default=8, ge=1)
    """Groups per optimiser step."""
    publish_every: int = Field(default=1, ge=1)
    """Publish weights every this many steps."""
    weights_dtype: str = "bfloat16"
    """dtype of the published inference weights."""
