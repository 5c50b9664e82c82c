"""Shared-prefix forward: the rows of a group share their prompt, so the trainer runs it once.

A GRPO batch is groups of completions of one prompt. Causal attention makes the logits at a
position depend only on the tokens up to it, so wherever rows begin with the same tokens their
logits there are the same. `plan_packing` puts each group's rows into one packed row: the
prefix they share (their prompt, longer where every member also begins its completion alike),
then each member's own tokens, whose positions restart after the prefix and whose attention
reaches the prefix and their own earlier tokens only. `packed_logits` runs the model on the
packed rows and gathers the logits back into the rows' layout, so everything after the forward
(log-probs, the loss, its gradient, which flows into the shared positions from every member) is
what it was; the logits agree with the rows' own forward up to float rounding
(tests/trainer/test_prefix.py).

On the arithmetic recipe (prompts of 5 tokens, completions of 2 or 3, groups of 8) the prompt alone
leaves 232 of a step's 512 positions (forward and backward 38 -> 21 ms on one CPU thread), and the
answers' common first tokens fewer still: the trainer's `positions_saved` read 0.66 in the vs-TRL runs. The
packed rows attend through a dense mask (T x T per packed row, where the rows' own forward is
causal), so packing is chosen only where the positions it saves outweigh that attention
(`worth_it`); long completions of a short prompt stay unpacked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

#: attention implementations the packed mask can be given to (a 4-D mask used as is)
MASKABLE = ("sdpa", "eager")


@dataclass
class Packing:
    tokens: torch.Tensor  # int64 [C, T]: one row per group of rows sharing a prefix
    positions: torch.Tensor  # int64 [C, T]: each member's positions continue the prefix's
    allowed: torch.Tensor  # bool [C, 1, T, T]: which keys each query sees
    index: torch.Tensor  # int64 [N, L]: where each row's position lies in the packed rows, flattened
    positions_run: int  # C x T


def _common_length(tokens: np.ndarray, lengths: np.ndarray, members: list[int]) -> int:
    """How many leading tokens all `members` share."""
    first = members[0]
    shared = int(lengths[members].min())
    for i in members[1:]:
        differ = np.flatnonzero(tokens[i, :shared] != tokens[first, :shared])
        if len(differ):
            shared = int(differ[0])
    return shared


def worth_it(rows_cost: tuple[int, int], packed_cost: tuple[int, int], hidden_size: int) -> bool:
    """Whether the packed forward is clearly cheaper: (padded positions, attention pairs) each. A
    position costs its layers' matrix products, ~4 x hidden_size times an attention pair's work."""
    weight = 4 * hidden_size
    rows = rows_cost[0] * weight + rows_cost[1]
    packed = packed_cost[0] * weight + packed_cost[1]
    return packed <= 0.8 * rows


def plan_packing(
    tokens: torch.Tensor, lengths: torch.Tensor, mask: torch.Tensor, pad_id: int, hidden_size: int
) -> Packing | None:
    """The packing of right-padded rows (`trainer.rows.Rows`: `mask` marks the predicted tokens
    that are trained), or None where it would not pay. Rows are grouped by their prompt (the
    tokens before their first trained token); a group's shared prefix is what all its rows have in
    common, at least the prompt."""
    tok = tokens.numpy()
    n, width = tok.shape
    lens = lengths.numpy()
    trained = mask.numpy() > 0
    first = np.where(trained.any(1), trained.argmax(1) + 1, lens)
    groups: dict[bytes, list[int]] = {}
    for i in range(n):
        groups.setdefault(tok[i, : first[i]].tobytes(), []).append(i)
    if len(groups) == n:
        return None
    members = list(groups.values())
    shared = [_common_length(tok, lens, m) for m in members]
    sizes = [s + int((lens[m] - s).sum()) for m, s in zip(members, shared, strict=True)]
    c, t = len(members), max(sizes)
    if not worth_it((n * width, n * width * width), (c * t, c * t * t), hidden_size):
        return None
    packed = np.full((c, t), pad_id, np.int64)
    positions = np.zeros((c, t), np.int64)
    segment = np.full((c, t), -2, np.int64)  # -1: the shared prefix; k: member k; -2: padding
    index = np.zeros((n, width), np.int64)
    for g, (rows, s) in enumerate(zip(members, shared, strict=True)):
        base = g * t
        packed[g, :s] = tok[rows[0], :s]
        positions[g, :s] = np.arange(s)
        segment[g, :s] = -1
        at = s
        for k, i in enumerate(rows):
            own = int(lens[i]) - s
            packed[g, at : at + own] = tok[i, s : lens[i]]
            positions[g, at : at + own] = np.arange(s, lens[i])
            segment[g, at : at + own] = k
            index[i, :s] = base + np.arange(s)
            index[i, s : lens[i]] = base + at + np.arange(own)
            index[i, lens[i] :] = index[i, lens[i] - 1]  # padding: any real position (no loss there)
            at += own
    seg = torch.from_numpy(segment)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    same = seg[:, :, None] == seg[:, None, :]
    allowed = causal & (same | (seg[:, None, :] == -1)) & (seg[:, :, None] != -2)
    allowed |= torch.eye(t, dtype=torch.bool)  # a padding query sees itself: no row of -inf
    return Packing(
        torch.from_numpy(packed),
        torch.from_numpy(positions),
        allowed[:, None],
        torch.from_numpy(index),
        c * t,
    )


def packed_logits(model: Any, packing: Packing, device: torch.device, additive: bool) -> torch.Tensor:
    """Logits [N, L, V] in the rows' layout, from one forward over the packed rows. `additive`:
    the model's attention adds its mask to the scores (eager) rather than taking a boolean one
    (sdpa)."""
    allowed = packing.allowed.to(device)
    mask = allowed
    if additive:
        blocked = torch.finfo(torch.float32).min
        mask = torch.zeros(allowed.shape, device=device).masked_fill_(~allowed, blocked)
    logits = model(
        input_ids=packing.tokens.to(device),
        attention_mask=mask,
        position_ids=packing.positions.to(device),
    ).logits
    flat = logits.reshape(-1, logits.shape[-1])
    n, width = packing.index.shape
    return flat[packing.index.to(device).reshape(-1)].reshape(n, width, -1)
