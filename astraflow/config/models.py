"""Model and tokenizer specs: a tiny transformers model built from a config, or a local checkpoint."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from astraflow.config.base import StrictModel


class TokenizerSpec(StrictModel):
    """The project's own tokenizer (nothing is downloaded)."""

    type: Literal["chars"] = "chars"
    """`chars`: one token per character of the alphabet plus <pad>, <bos>, <eos>, <unk>."""
    alphabet: str | None = Field(default=None, min_length=1)
    """The characters of the vocabulary, in order; default: digits, ASCII letters, punctuation,
    space and newline (98). A task's own small alphabet shrinks what an untrained policy samples
    from: with 4 message symbols instead of 98 a useful token is drawn ~25x more often."""
    extra_chars: str = ""
    """Characters to add to the alphabet (for environments that need more)."""


class ModelSpec(StrictModel):
    """A causal LM: a local checkpoint (`path`) or a tiny one built from the fields below."""

    path: str | None = None
    """Local directory in the transformers `save_pretrained` layout (with its tokenizer). When set,
    the architecture fields are ignored."""
    architecture: Literal["qwen2", "llama"] = "qwen2"
    """transformers architecture of the tiny model."""
    hidden_size: int = Field(default=128, ge=8, le=8192)
    """Width of the residual stream."""
    num_layers: int = Field(default=4, ge=1, le=128)
    """Number of decoder layers."""
    num_heads: int = Field(default=4, ge=1, le=128)
    """Attention heads."""
    num_kv_heads: int = Field(default=2, ge=1, le=128)
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = Field(default=256, ge=8, le=65536)
    """Width of the MLP."""
    max_position_embeddings: int = Field(default=512, ge=16, le=1 << 20)
    """Longest sequence (prompt plus generation) the model handles."""
    rope_theta: float = Field(default=10000.0, gt=0)
    """RoPE base."""
    tie_word_embeddings: bool = True
    """Share the input embedding and the output head."""
    seed: int = Field(default=0, ge=0)
    """Seed of the random initialisation: every component builds the same initial weights."""
    tokenizer: TokenizerSpec = TokenizerSpec()
    """Tokenizer of the tiny model."""

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSpec:
        if self.path is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}"
                )
            if self.num_heads % self.num_kv_heads:
                raise ValueError(
                    f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
                )
        return self
