"""Policy-gradient losses as pure functions of tensors (no model, no Kafka): golden-value tested.

The trainer is algorithm-blind: advantages arrive on the Samples (stamped by streams), so all it
needs is a per-token surrogate and a way to average it. Every per-token tensor here is aligned to
the *predicted* tokens (position t holds the log-prob of token t+1 given the prefix), shape [B, T].
pi is the policy being trained, mu the behaviour policy whose log-probs the workers recorded.

Surrogates (`policy_loss` in the recipe's `trainer.loss`):
- `ppo` (`clipped_pg_loss`): the clipped surrogate with the ratio pi/mu (asymmetric clip-low /
  clip-high, DAPO's clip-higher), optional dual clip (Ye et al. 2020: bounds the loss of
  negative-advantage tokens whose ratio exploded), optional truncated importance sampling
  (decoupled PPO: the ratio is taken against the current policy itself, which with one optimiser
  step per batch is the proximal, pre-update policy, and the behaviour mismatch is corrected by the
  detached weight min(pi/mu, cap)).
- `gspo` (`gspo_loss`): GSPO (Zheng et al. 2025): one ratio per sequence, the geometric mean
  exp(mean over its loss tokens of log pi - log mu), clipped per sequence.
- `cispo` (`cispo_loss`): CISPO (MiniMax-M1 2025): no token loses its gradient; the detached,
  clipped IS weight clip(pi/mu, 1 - clip_low, 1 + clip_high) scales A * log pi.
- `m2po` (`m2po_cut`, `m2po_loss`): M2PO (Zheng, Zhao, Chen 2025, arXiv 2510.01161): a trust
  region on the second moment of the log-ratios, enforced by masking the most extreme tokens of
  the whole batch; the rest keep their unclipped ratio.
Every log-ratio is clamped to +-`log_ratio_clamp` before exp (`log_ratio`): exp overflows float32
above 88, and an inf ratio makes the loss and the gradient inf or NaN.

Regularisers: a KL to a frozen reference, by one of Schulman's estimators k1, k2, k3
(`kl_estimate`, which says what gradient each gives), in the loss or subtracted from the
advantages; an entropy bonus.

`aggregate` (trainer/aggregation.py) averages per-token losses: token-mean, seq-mean-token-mean,
seq-mean-token-sum, or Dr. GRPO's constant normaliser. The denominators can be passed in, so
micro-batches and data-parallel ranks each add their share of one batch-wide value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from astraflow.sampling import SamplingSettings, entropy_of, sampling_logprobs
from trainer.aggregation import aggregate

PolicyLoss = Literal["ppo", "gspo", "cispo", "m2po"]
KLEstimator = Literal["k1", "k2", "k3"]
KLIn = Literal["loss", "reward"]


@dataclass(frozen=True)
class LossSettings:
    """Plain parameters of `policy_loss` (built from the recipe's `trainer.loss`)."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None
    tis_cap: float | None = None
    aggregation: str = "token-mean"
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    policy_loss: PolicyLoss = "ppo"
    log_ratio_clamp: float = 20.0
    m2_threshold: float = 0.04
    norm_length: float | None = None
    kl_estimator: KLEstimator = "k3"
    kl_in: KLIn = "loss"


def token_logprobs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    sampling: SamplingSettings | None = None,
    with_entropy: bool = True,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
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


def log_ratio(logp: torch.Tensor, behaviour_logp: torch.Tensor, clamp: float) -> torch.Tensor:
    """log(pi / mu) clamped to [-clamp, clamp], so that exp() of it stays finite. A token beyond the
    clamp gets no gradient through the ratio (like a clipped token): it is that far off-policy."""
    return torch.clamp(logp - behaviour_logp, -clamp, clamp)


def clipped_pg_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    tis_cap: float | None = None,
    log_ratio_clamp: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate loss (to minimise).

    Returns (loss, clipped, is_weight): `clipped` marks tokens whose gradient the clip (or dual
    clip) removed; `is_weight` is the truncated importance weight (ones without `tis_cap`).
    """
    if tis_cap is None:
        ratio = torch.exp(log_ratio(logp, behaviour_logp, log_ratio_clamp))
        is_weight = torch.ones_like(logp)
    else:
        ratio = torch.exp(logp - logp.detach())  # == 1, with the gradient of log pi
        is_weight = torch.clamp(
            torch.exp(log_ratio(logp.detach(), behaviour_logp, log_ratio_clamp)), max=tis_cap
        )
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


def gspo_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    log_ratio_clamp: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GSPO's sequence-level clipped surrogate, per token (to minimise).

    s_i = exp(mean over sequence i's loss tokens of log pi - log mu) is the one ratio of the
    sequence; each token carries s_i with the gradient s_i * grad log pi_t (the paper's GSPO-token
    form: sg[s_i] * pi_t / sg[pi_t]), and the clip [1 - clip_low, 1 + clip_high] acts on s_i, so it
    keeps or drops a whole sequence. With seq-mean-token-mean aggregation and one advantage per
    sequence this is exactly the paper's gradient, s_i * A_i * mean_t grad log pi_t; the paper's
    clip ranges are tiny (3e-4, 4e-4) because a sequence ratio moves far less than a token's.

    Returns (loss, clipped, sequence ratio broadcast to the tokens).
    """
    m = mask.bool()
    per_token = torch.where(m, logp.detach() - behaviour_logp, torch.zeros_like(logp))
    mean = per_token.sum(-1) / m.sum(-1).clamp(min=1)
    seq_ratio = torch.exp(torch.clamp(mean, -log_ratio_clamp, log_ratio_clamp))[:, None].expand_as(logp)
    ratio = seq_ratio * torch.exp(logp - logp.detach())
    unclipped = -advantages * ratio
    clipped_obj = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped_obj), clipped_obj > unclipped, seq_ratio


def cispo_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    log_ratio_clamp: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CISPO's per-token loss -sg(w) * A * log pi, w = clip(pi / mu, 1 - clip_low, 1 + clip_high).

    Unlike PPO's clip, which zeroes the gradient of a token whose ratio left the range, CISPO keeps
    every token's gradient and bounds only its weight. The loss value is not comparable with the
    ratio surrogates (it holds log pi); its gradient, -w * A * grad log pi, is.

    Returns (loss, weight_clipped, w).
    """
    ratio = torch.exp(log_ratio(logp.detach(), behaviour_logp, log_ratio_clamp))
    weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return -advantages * weight * logp, weight != ratio, weight


def m2po_cut(sq_log_ratios: torch.Tensor, threshold: float) -> float:
    """M2PO's mask as a cut: tokens whose squared log-ratio is >= the cut leave the loss (inf: none).

    `sq_log_ratios` are (log pi_old - log mu)^2 of *every* loss token of the batch (all
    micro-batches, all ranks), pi_old the policy before this step. What this follows (arXiv
    2510.01161, Algorithm 1, as AReaL implements it for `actor.m2_threshold`): M2 = the mean of
    these over the tokens still in the loss; while M2 > threshold (the paper's tau_M2, 0.04),
    mask the token with the largest squared log-ratio. Masking the largest value never raises the
    mean, so greedy masking is: sort descending and mask the shortest prefix after which the mean
    of the rest is <= threshold (all tokens if none). Ties at the cut are masked together, so the
    result depends only on the values, never on their order or on how the batch was split.
    The openreview revision and Trinity-RFT restrict the count to the tokens PPO would clip
    (A > 0 with ratio > 1, A < 0 with ratio < 1); this follows the arXiv version over all tokens.
    """
    values = sq_log_ratios.detach().double().flatten()
    n = values.numel()
    if n == 0 or float(values.mean()) <= threshold:
        return math.inf
    ordered = torch.sort(values, descending=True).values
    suffix = ordered.flip(0).cumsum(0).flip(0)  # suffix[k] = sum of ordered[k:]
    rest_mean = suffix / torch.arange(n, 0, -1, dtype=torch.float64)
    fits = torch.nonzero(rest_mean <= threshold)
    masked = int(fits[0]) if len(fits) else n  # >= 1: the mean of all exceeds the threshold
    return float(ordered[masked - 1])


def m2po_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    keep: torch.Tensor,
    *,
    log_ratio_clamp: float = 20.0,
) -> torch.Tensor:
    """M2PO's per-token loss -M * A * pi/mu: the tokens the second-moment mask `keep`s have their
    plain, unclipped ratio; the masked ones contribute nothing. The mean stays over *all* loss
    tokens (the paper's 1 / sum |o_i|), so masking shrinks the step rather than reweighting the rest."""
    ratio = torch.exp(log_ratio(logp, behaviour_logp, log_ratio_clamp))
    return torch.where(keep.bool(), -advantages * ratio, torch.zeros_like(ratio))


def kl_estimate(
    logp: torch.Tensor, ref_logp: torch.Tensor, estimator: KLEstimator = "k3", clamp: float = 20.0
) -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from tokens sampled from pi (Schulman, "Approximating KL
    divergence", 2020), with d = log pi - log ref (clamped to +-`clamp`):

    - k1 = d: unbiased, high variance, often negative. Its gradient as a loss, grad log pi, is zero
      in expectation: in the loss it only adds noise. Use it in the reward (`kl_in: reward`): the
      policy gradient of -kl_coef * d is the gradient of -kl_coef * KL(pi || ref) at each token.
    - k2 = d^2 / 2: biased (exact to second order), low variance. As a loss its gradient
      d * grad log pi is in expectation the gradient of KL(pi || ref).
    - k3 = exp(-d) + d - 1: unbiased for KL(pi || ref) and non-negative. But as a loss its gradient
      (1 - ref / pi) * grad log pi is in expectation the gradient of KL(ref || pi), the reverse,
      mass-covering divergence, not of KL(pi || ref) (what GRPO's k3-in-loss really optimises).

    All of this holds on-policy; on tokens of a stale behaviour policy each is further off.
    """
    d = torch.clamp(logp - ref_logp, -clamp, clamp)
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.exp(-d) + d - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; known: k1, k2, k3")


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate exp(r) - r - 1, r = ref - logp: its value estimates KL(pi || ref), but
    its gradient as a loss is that of KL(ref || pi) (see `kl_estimate`)."""
    return kl_estimate(logp, ref_logp, "k3")


def _surrogate(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
    m2po_keep: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s, clamp = settings, settings.log_ratio_clamp
    if s.policy_loss == "ppo":
        return clipped_pg_loss(
            logp,
            behaviour_logp,
            advantages,
            clip_low=s.clip_low,
            clip_high=s.clip_high,
            dual_clip=s.dual_clip,
            tis_cap=s.tis_cap,
            log_ratio_clamp=clamp,
        )
    ones = torch.ones_like(logp)
    if s.policy_loss == "gspo":
        loss, clipped, _ = gspo_loss(
            logp,
            behaviour_logp,
            advantages,
            mask,
            clip_low=s.clip_low,
            clip_high=s.clip_high,
            log_ratio_clamp=clamp,
        )
        return loss, clipped, ones
    if s.policy_loss == "cispo":
        return cispo_loss(
            logp,
            behaviour_logp,
            advantages,
            clip_low=s.clip_low,
            clip_high=s.clip_high,
            log_ratio_clamp=clamp,
        )
    if s.policy_loss == "m2po":
        if m2po_keep is None:  # this call sees the whole batch: its own tokens decide
            sq = log_ratio(logp.detach(), behaviour_logp, clamp) ** 2
            m2po_keep = mask.bool() & (sq < m2po_cut(sq[mask.bool()], s.m2_threshold))
        keep = m2po_keep.bool()
        return (
            m2po_loss(logp, behaviour_logp, advantages, keep, log_ratio_clamp=clamp),
            mask.bool() & ~keep,
            ones,
        )
    raise ValueError(f"unknown policy loss {s.policy_loss!r}; known: ppo, gspo, cispo, m2po")


def policy_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
    *,
    entropy: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    m2po_keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The trainer's loss for one (micro-)batch and the *sums* behind its metrics (sums add up over
    micro-batches and ranks; divide by `tokens` for means).

    loss = agg(surrogate) + kl_coef * agg(KL estimate to ref) - entropy_coef * agg(entropy)

    With `kl_in: reward` the KL term leaves the loss: kl_coef * KL estimate (detached) is subtracted
    from each token's advantage before the surrogate. `m2po_keep` is M2PO's batch-wide mask
    (the trainer computes it on the whole batch, see trainer/engine.py); without it an `m2po` call
    masks by its own tokens. `clipped` counts the tokens whose gradient the clip removed (ppo,
    gspo), whose weight was clipped (cispo) or that the second-moment mask dropped (m2po).
    """
    kl = None
    if ref_logp is not None:
        kl = kl_estimate(logp, ref_logp, settings.kl_estimator, settings.log_ratio_clamp)
        if settings.kl_in == "reward" and settings.kl_coef:
            advantages = advantages - settings.kl_coef * kl.detach()
    pg, clipped, is_weight = _surrogate(logp, behaviour_logp, advantages, mask, settings, m2po_keep)

    def agg(per_token: torch.Tensor) -> torch.Tensor:
        """`per_token` reduced over `mask` the way `settings.aggregation` says."""
        return aggregate(
            per_token,
            mask,
            settings.aggregation,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            norm_length=settings.norm_length,
        )

    pg_loss = agg(pg)
    loss = pg_loss
    m = mask.bool()
    with torch.no_grad():
        ratio_log = log_ratio(logp, behaviour_logp, settings.log_ratio_clamp)[m]
        stats = {
            "tokens": float(m.sum()),
            "loss.pg": float(pg_loss.detach()),
            "clipped": float(clipped[m].sum()),
            "is_weight": float(is_weight[m].sum()),
            "mismatch.abs": float(ratio_log.abs().sum()),
            "mismatch.kl": float((torch.exp(ratio_log) - 1.0 - ratio_log).sum()),
        }
    if kl is not None:
        kl_loss = agg(kl)
        if settings.kl_coef and settings.kl_in == "loss":
            loss = loss + settings.kl_coef * kl_loss
        stats["kl_ref"] = float(kl.detach()[m].sum())
        stats["loss.kl"] = float(kl_loss.detach())
    if entropy is not None:
        stats["entropy"] = float(entropy.detach()[m].sum())
        if settings.entropy_coef:
            loss = loss - settings.entropy_coef * agg(entropy)
    stats["loss"] = float(loss.detach())
    return loss, stats
