"""Drawing tokens in the torch engine. The distribution itself, and the log-probs the trainer must
agree with, is `astraflow.sampling.sampling_logprobs` (shared with the trainer)."""

from __future__ import annotations

import torch

from astraflow.sampling import sampling_logprobs

__all__ = ["sample", "sampling_logprobs"]


def sample(logp: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from `logp` [B, V]; returns (tokens [B], their log-probs [B])."""
    probs = logp.exp()
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
