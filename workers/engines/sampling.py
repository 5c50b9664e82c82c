"""Drawing tokens in the torch engine. The distribution itself, and the log-probs the trainer must
agree with, is `astraflow.sampling.sampling_logprobs` (shared with the trainer)."""

from __future__ import annotations

import hashlib

import torch

from astraflow.sampling import sampling_logprobs

__all__ = ["sample", "sample_seeded", "sampling_logprobs", "seeded_noise"]


def sample(logp: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from `logp` [B, V]; returns (tokens [B], their log-probs [B])."""
    probs = logp.exp()
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def seeded_noise(seed: int, index: int, size: int) -> torch.Tensor:
    """Gumbel noise [size] for token `index` of a request seeded with `seed` (float64)."""
    key = hashlib.blake2b(f"{seed}#{index}".encode(), digest_size=8).digest()
    g = torch.Generator().manual_seed(int.from_bytes(key, "little") >> 1)
    u = torch.rand(size, generator=g, dtype=torch.float64).clamp_(min=1e-300)
    return -torch.log(-torch.log(u))


def sample_seeded(logp: torch.Tensor, noise: torch.Tensor) -> tuple[int, float]:
    """Draw from one row `logp` [V] by the Gumbel-max trick: the token maximising logp + noise, where
    `noise` is i.i.d. Gumbel (`seeded_noise`). Distributed as `logp`; never a token of probability 0.
    Each token has its own noise, so two policies drawing with one seed (common randomness) draw the
    same token far more often than independent draws would: always when their distributions are
    equal, nearly always on a token both favour. Returns (token, its log-prob)."""
    token = int((logp.double() + noise).argmax())
    return token, float(logp[token])
