"""Policy-gradient losses as pure functions of tensors (no model, no Kafka): golden-value tested.

The trainer is algorithm-blind: advantages arrive on the Samples (stamped by streams), so all it
needs is a per-token surrogate and a way to average it. Every per-token tensor here is aligned to
the *predicted* tokens (position t holds the log-prob of token t+1 given the prefix), shape [B, T].

- `clipped_pg_loss`: PPO-style clipped surrogate with the importance ratio against the behaviour
  log-probs the workers recorded (asymmetric clip-low / clip-high, as in DAPO's clip-higher),
  optional dual clip (Ye et al. 2020: bounds the loss of negative-advantage tokens whose ratio
  exploded), optional truncated importance sampling: the ratio is then taken against the current
  policy itself (the proximal policy of decoupled PPO, which with one optimiser step per batch is
  the pre-update policy) and the behaviour mismatch is corrected by the weight min(pi/mu, cap).
- `kl_k3`: the k3 estimator of KL(pi || ref) (Schulman), unbiased and non-negative per token.
- `aggregate`: token-level (mean over every loss token of the batch) or sequence-level (mean over
  sequences of each sequence's token mean). The denominators can be passed in, so micro-batches
  and data-parallel ranks each add their share of one global mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from astraflow.sampling import SamplingSettings, entropy_of, sampling_logprobs

Aggregation = Literal["token", "sequence"]


@dataclass(frozen=True)
class LossSettings:
    """Plain parameters of `policy_loss` (built from the recipe's `trainer.loss`)."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None
    tis_cap: float | None = None
    aggregation: Aggregation = "token"
    kl_coef: float = 0.0
    entropy_coef: float = 0.0


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, sampling: SamplingSettings | None = None,
                   with_entropy: bool = True, entropy_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of tokens[:, 1:] under logits[:, :-1] in the workers' sampling distribution
    (`astraflow.sampling`: temperature, top-p, top-k, the very function the torch engine samples
    with) and, optionally, the entropy of each of those distributions (without a graph unless
    `entropy_grad`, when it is only reported). Shapes [B, T-1].

    With top-p or top-k a token outside the current policy's kept set gets log-prob -inf (and no
    gradient): the caller must mask it out of the loss (`trainer.engine` does, and counts it).
    `sampling` None: temperature 1, no truncation."""
    sampling = sampling or SamplingSettings()
    logp_all = sampling_logprobs(logits[:, :-1], sampling.temperature, sampling.top_p, sampling.top_k)
    logp = logp_all.gather(-1, tokens[:, 1:].long().unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_of(logp_all)
    return logp, entropy


def clipped_pg_loss(logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor, *,
                    clip_low: float, clip_high: float, dual_clip: float | None = None,
                    tis_cap: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate loss (to minimise).

    Returns (loss, clipped, is_weight): `clipped` marks tokens whose gradient the clip (or dual
    clip) removed; `is_weight` is the truncated importance weight (ones without `tis_cap`).
    """
    if tis_cap is None:
        ratio = torch.exp(logp - behaviour_logp)
        is_weight = torch.ones_like(logp)
    else:
        ratio = torch.exp(logp - logp.detach())  # == 1, with the gradient of log pi
        is_weight = torch.clamp(torch.exp(logp.detach() - behaviour_logp), max=tis_cap)
    unclipped = -advantages * ratio
    clipped_obj = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped_obj)
    clipped = clipped_obj > unclipped
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
        clipped = clipped | dual
    return loss * is_weight, clipped, is_weight


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || ref) from samples of pi: exp(r) - r - 1, r = ref - logp."""
    r = ref_logp - logp
    return torch.exp(r) - r - 1.0


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: Aggregation, *,
              num_tokens: float | None = None, num_seqs: float | None = None) -> torch.Tensor:
    """Mean of `per_token` over the loss tokens (`mask`), token- or sequence-level.

    `num_tokens` / `num_seqs` override the denominators (the batch-wide counts, when this call
    sees only a micro-batch); sequences without loss tokens count for nothing."""
    mask = mask.to(per_token.dtype)
    total = per_token * mask
    if mode == "token":
        denom = float(mask.sum().item()) if num_tokens is None else num_tokens
        return total.sum() / max(denom, 1.0)
    if mode == "sequence":
        per_seq = total.sum(-1) / mask.sum(-1).clamp(min=1.0)
        denom = float((mask.sum(-1) > 0).sum().item()) if num_seqs is None else num_seqs
        return per_seq.sum() / max(denom, 1.0)
    raise ValueError(f"unknown aggregation {mode!r}; known: token, sequence")


def policy_loss(logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, settings: LossSettings, *, entropy: torch.Tensor | None = None,
                ref_logp: torch.Tensor | None = None, num_tokens: float | None = None,
                num_seqs: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The trainer's loss for one (micro-)batch and the *sums* behind its metrics (sums add up over
    micro-batches and ranks; divide by `tokens` for means).

    loss = agg(clipped pg) + kl_coef * agg(k3 KL to ref) - entropy_coef * agg(entropy)
    """
    pg, clipped, is_weight = clipped_pg_loss(
        logp, behaviour_logp, advantages, clip_low=settings.clip_low, clip_high=settings.clip_high,
        dual_clip=settings.dual_clip, tis_cap=settings.tis_cap)
    agg = dict(mode=settings.aggregation, num_tokens=num_tokens, num_seqs=num_seqs)
    pg_loss = aggregate(pg, mask, **agg)  # type: ignore[arg-type]
    loss = pg_loss
    m = mask.bool()
    with torch.no_grad():
        log_ratio = (logp - behaviour_logp)[m]
        stats = {
            "tokens": float(m.sum()),
            "loss.pg": float(pg_loss.detach()),
            "clipped": float(clipped[m].sum()),
            "is_weight": float(is_weight[m].sum()),
            "mismatch.abs": float(log_ratio.abs().sum()),
            "mismatch.kl": float((torch.exp(log_ratio) - 1.0 - log_ratio).sum()),
        }
    if ref_logp is not None:
        kl = kl_k3(logp, ref_logp)
        kl_loss = aggregate(kl, mask, **agg)  # type: ignore[arg-type]
        if settings.kl_coef:
            loss = loss + settings.kl_coef * kl_loss
        stats["kl_ref"] = float(kl.detach()[m].sum())
        stats["loss.kl"] = float(kl_loss.detach())
    if entropy is not None:
        stats["entropy"] = float(entropy.detach()[m].sum())
        if settings.entropy_coef:
            loss = loss - settings.entropy_coef * aggregate(entropy, mask, **agg)  # type: ignore[arg-type]
    stats["loss"] = float(loss.detach())
    return loss, stats
