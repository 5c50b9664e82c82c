"""Pure sampling maths of the torch engine: the distribution a token is drawn from, and its log-probs.

The behaviour log-prob of a generated token must be that of the distribution it was actually drawn
from (temperature and nucleus applied), so the trainer's importance ratio is exact. Both the engine and
the tests call `sampling_logprobs`, so the teacher-forced check compares like with like.
"""

from __future__ import annotations

import torch


def sampling_logprobs(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Log-probabilities [B, V] (float32) of the sampling distribution of each row.

    `temperature` [B]: <= 0 means greedy (all mass on the arg-max, log-prob 0 there, -inf elsewhere).
    `top_p` [B] in (0, 1]: keep the smallest set of most likely tokens whose mass reaches top_p
    (the token that crosses the threshold is kept), renormalised. Tokens outside get -inf.
    """
    logits = logits.float()
    greedy = temperature <= 0
    safe_t = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    scaled = logits / safe_t.unsqueeze(-1)
    logp = torch.log_softmax(scaled, dim=-1)
    if bool((top_p < 1.0).any()):
        sorted_logp, order = torch.sort(logp, dim=-1, descending=True)
        probs = sorted_logp.exp()
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p.float().unsqueeze(-1)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = torch.log_softmax(scaled.masked_fill(drop, float("-inf")), dim=-1)
    if bool(greedy.any()):
        best = logits.argmax(dim=-1, keepdim=True)
        delta = torch.full_like(logp, float("-inf")).scatter(-1, best, 0.0)
        logp = torch.where(greedy.unsqueeze(-1), delta, logp)
    return logp


def sample(logp: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from `logp` [B, V]; returns (tokens [B], their log-probs [B])."""
    probs = logp.exp()
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
