"""The one definition of the behaviour distribution: logits -> log-probs of what the sampler draws from.

The torch engine samples from `sampling_logprobs(logits, T, top_p, top_k)` and records the log-prob
of the drawn token under it; the trainer computes the log-probs of the trained tokens with the same
function and the same settings (the recipe's `worker` section), so on-policy the importance ratio
is 1 up to float rounding. Shared here because workers and trainer must not import each other; it
imports torch, so only the components that hold tensors import it (`import astraflow` stays light).

The distribution, per row: scale the logits by 1 / temperature; keep the `top_k` most likely tokens
(0: all) and, independently, the nucleus, i.e. the smallest set of most likely tokens whose mass
under the temperature-scaled distribution reaches `top_p` (the token that crosses the threshold is
kept); renormalise over the tokens kept by both (SGLang's and flashinfer's "joint" order: both
filters read the same temperature-scaled distribution). Tokens outside get -inf.

Gradients flow through the kept tokens' log-probs (the keep/drop decision is a step function with no
gradient). A token outside the kept set has log-prob -inf and no gradient: the trainer never trains
on one (see `trainer.engine`), since the sampler could not have drawn it under these weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from astraflow.config.worker import WorkerConfig


def check_truncation(top_p: float, top_k: int) -> None:
    """ValueError unless top_p is in (0, 1] and top_k >= 0 (0: off): the rule every sampler shares."""
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be at least 0 (0: off), got {top_k}")


@dataclass(frozen=True)
class SamplingSettings:
    """The settings that define a trainable behaviour distribution (temperature > 0)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 to train (0 is greedy), got {self.temperature}")
        check_truncation(self.top_p, self.top_k)

    @classmethod
    def of(cls, worker: WorkerConfig) -> SamplingSettings:
        """The settings of a recipe's `worker` section (what the trainer must use)."""
        return cls(temperature=worker.temperature, top_p=worker.top_p, top_k=worker.top_k)

    @property
    def truncated(self) -> bool:
        """Whether some tokens may get probability 0 (top-p or top-k on)."""
        return self.top_p < 1.0 or self.top_k > 0


def _as_column(value: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    """`value` (a number, or one value per row of `like[..., V]`) as a tensor broadcasting over V."""
    t = torch.as_tensor(value, dtype=torch.float32, device=like.device)
    return t.unsqueeze(-1) if t.dim() else t


def sampling_logprobs(
    logits: torch.Tensor,
    temperature: torch.Tensor | float,
    top_p: torch.Tensor | float = 1.0,
    top_k: torch.Tensor | int = 0,
) -> torch.Tensor:
    """Log-probabilities [..., V] (float32) of the sampling distribution of each row of `logits` [..., V].

    Each setting is a number or a tensor of one value per row (shape `logits.shape[:-1]`).
    `temperature` > 0; a row with temperature <= 0 is greedy (all mass on the arg-max: log-prob 0
    there, -inf elsewhere), which the engines allow for evaluation but no recipe trains with.
    `top_p` in (0, 1]; `top_k` >= 0 (0: no top-k).
    """
    logits = logits.float()
    temp = _as_column(temperature, logits)
    greedy = temp <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temp), temp)
    logp = torch.log_softmax(scaled, dim=-1)
    p, k = _as_column(top_p, logits), _as_column(top_k, logits)
    if bool((p < 1.0).any()) or bool((k > 0).any()):
        with torch.no_grad():  # which tokens are kept is a discrete choice: no gradient through it
            sorted_logp, order = torch.sort(logp.detach(), dim=-1, descending=True)
            probs = sorted_logp.exp()
            mass_before = torch.cumsum(probs, dim=-1) - probs
            rank = torch.arange(logits.shape[-1], device=logits.device, dtype=torch.float32)
            drop_sorted = (mass_before >= p) | ((k > 0) & (rank >= k))
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = torch.log_softmax(scaled.masked_fill(drop, float("-inf")), dim=-1)
    if bool(greedy.any()):
        best = logits.argmax(dim=-1, keepdim=True)
        delta = torch.full_like(logp, float("-inf")).scatter(-1, best, 0.0)
        logp = torch.where(greedy, delta, logp)
    return logp


def entropy_of(logp: torch.Tensor) -> torch.Tensor:
    """Entropy [...] of distributions given as log-probs [..., V] that may hold -inf (dropped tokens:
    0 * -inf counts as 0, with a finite gradient)."""
    finite = torch.isfinite(logp)
    safe = logp.masked_fill(~finite, 0.0)
    return -(safe.exp().masked_fill(~finite, 0.0) * safe).sum(-1)
