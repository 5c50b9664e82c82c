"""A batch as padded rows: collation, micro-batching, and the forward that scores them.

`collate` right-pads a batch of Samples into `Rows`, whose per-token fields are aligned to the
predicted tokens; `micro_batches` sorts them by length and cuts them into micro-batches of at most
`micro_batch_tokens` padded tokens (trainer/engine.py accumulates their gradients); `_logits` is the
one forward every pass of the trainer runs on such rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from astraflow.records import Sample


@dataclass
class Rows:
    """A padded batch; per-token fields are aligned to the predicted tokens (length L - 1)."""

    tokens: torch.Tensor  # int64 [N, L]
    lengths: torch.Tensor  # int64 [N]
    mask: torch.Tensor  # float32 [N, L-1]
    behaviour: torch.Tensor  # float32 [N, L-1]
    advantages: torch.Tensor  # float32 [N, L-1]

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @classmethod
    def filler(cls, pad_id: int) -> Rows:
        """One row of padding with no loss token: what a rank without rows (or with fewer
        micro-batches than another, under FSDP) runs to join the collectives, contributing zeros."""
        return cls(torch.full((1, 2), pad_id), torch.tensor([2]), *(torch.zeros(1, 1) for _ in range(3)))

    def select(self, index: torch.Tensor) -> Rows:
        """Rows `index`, trimmed to their longest sequence."""
        length = max(int(self.lengths[index].max()), 2) if len(index) else 2
        return Rows(
            self.tokens[index, :length],
            self.lengths[index],
            self.mask[index, : length - 1],
            self.behaviour[index, : length - 1],
            self.advantages[index, : length - 1],
        )

    def tensors(self) -> list[torch.Tensor]:
        return [self.tokens, self.lengths, self.mask, self.behaviour, self.advantages]


def collate(samples: list[Sample], pad_id: int) -> Rows:
    n, length = len(samples), max(max(len(s.tokens) for s in samples), 2)
    tokens = np.full((n, length), pad_id, np.int64)
    lengths = np.zeros(n, np.int64)
    mask, behaviour, adv = (np.zeros((n, length), np.float32) for _ in range(3))
    for i, s in enumerate(samples):
        k = len(s.tokens)
        tokens[i, :k], lengths[i] = s.tokens, k
        mask[i, :k], behaviour[i, :k], adv[i, :k] = s.loss_mask, s.logprobs, s.advantages
    return Rows(
        torch.from_numpy(tokens),
        torch.from_numpy(lengths),
        torch.from_numpy(mask[:, 1:]).contiguous(),
        torch.from_numpy(behaviour[:, 1:]).contiguous(),
        torch.from_numpy(adv[:, 1:]).contiguous(),
    )


def _logits(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    """The logits of right-padded rows (`collate`). No attention mask: causal attention alone gives
    every real token exactly the context it has with the padding mask, since padding only follows
    it (bitwise-equal logits, tests/trainer/test_engine.py), and the model builds no 4-D mask: a
    training step of the arithmetic recipe's model 5% shorter on CPU. Padding positions get logits
    too, which the loss mask leaves out."""
    return model(input_ids=tokens).logits


def micro_batches(rows: Rows, max_tokens: int) -> list[Rows]:
    """Longest rows first, greedily packed so that rows x longest <= max_tokens (one row at least)."""
    order = torch.argsort(rows.lengths, descending=True, stable=True)
    out: list[Rows] = []
    current: list[int] = []
    for i in order.tolist():
        longest = int(rows.lengths[current[0]]) if current else int(rows.lengths[i])
        if current and (len(current) + 1) * longest > max_tokens:
            out.append(rows.select(torch.tensor(current)))
            current = []
        current.append(i)
    if current:
        out.append(rows.select(torch.tensor(current)))
    return out
