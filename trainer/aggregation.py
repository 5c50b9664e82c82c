"""How a per-token loss becomes one number: the aggregation modes of `trainer.loss.aggregation`.

A pure function of tensors, like the losses it serves (trainer/losses.py), golden-value tested
with them: token-mean, seq-mean-token-mean, seq-mean-token-sum, or Dr. GRPO's constant
normaliser. The denominators can be passed in, so micro-batches and data-parallel ranks each add
their share of one batch-wide value.
"""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "constant"]
#: Older names of aggregation modes, still accepted.
AGGREGATION_ALIASES = {"token": "token-mean", "sequence": "seq-mean-token-mean"}
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "constant")


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_length: float | None = None,
) -> torch.Tensor:
    """Average `per_token` over the loss tokens (`mask`):

    - `token-mean` (alias `token`): sum / loss tokens;
    - `seq-mean-token-mean` (alias `sequence`): mean over sequences of each sequence's token mean;
    - `seq-mean-token-sum`: mean over sequences of each sequence's token sum;
    - `constant`: Dr. GRPO's sum / (sequences x `norm_length`), a normaliser that depends on
      neither the lengths nor the number of loss tokens, so no sequence's tokens weigh more for
      being short.

    `num_tokens` / `num_seqs` override the denominators (the batch-wide counts, when this call
    sees only a micro-batch); sequences without loss tokens count for nothing."""
    mode = AGGREGATION_ALIASES.get(mode, mode)
    mask = mask.to(per_token.dtype)
    total = torch.where(mask > 0, per_token, torch.zeros_like(per_token))  # junk off the mask: 0, not 0*inf
    seqs = float((mask.sum(-1) > 0).sum().item()) if num_seqs is None else num_seqs
    if mode == "token-mean":
        denom = float(mask.sum().item()) if num_tokens is None else num_tokens
        return total.sum() / max(denom, 1.0)
    if mode == "seq-mean-token-mean":
        return (total.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / max(seqs, 1.0)
    if mode == "seq-mean-token-sum":
        return total.sum() / max(seqs, 1.0)
    if mode == "constant":
        if norm_length is None:
            raise ValueError("aggregation 'constant' needs norm_length")
        return total.sum() / (max(seqs, 1.0) * norm_length)
    raise ValueError(
        f"unknown aggregation {mode!r}; known: {', '.join(AGGREGATIONS)} "
        f"(aliases: {', '.join(AGGREGATION_ALIASES)})"
    )
