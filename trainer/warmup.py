"""Supervised warm-up before RL (`trainer.warmup`): a cold start on scripted demonstrations.

The trainer plays `demonstrations` expert episodes through the recipe's environment
(workers/demonstrations.py), then takes `steps` AdamW steps of its own (the RL optimiser's state is
untouched) on batches of `batch_size` of them drawn with the model's seed, minimising the mean
negative log-likelihood of the expert's tokens. Deterministic for a recipe on one machine.
"""

from __future__ import annotations

import random
import time
from typing import Any

import torch

from astraflow.config import Recipe
from astraflow.config.trainer import WarmupConfig
from astraflow.errors import ConfigError


def warm_up(
    model: torch.nn.Module, tokenizer: Any, recipe: Recipe, cfg: WarmupConfig, seed: int
) -> dict[str, float]:
    """Train `model` in place on the recipe's demonstrations; returns what it did: the mean loss of
    the first and last tenth of the steps, the demonstrations' mean reward (the expert's own score,
    1.0 for an expert that solves every task) and the seconds it took."""
    from workers.demonstrations import demonstrations
    from workers.envs.base import Codec

    start = time.monotonic()
    max_len = int(getattr(model.config, "max_position_embeddings", 1 << 30))
    demos = demonstrations(recipe, Codec(tokenizer), cfg.demonstrations, max_len)
    if not any(sum(d.mask) for d in demos):
        raise ConfigError(f"the expert of {recipe.feeder.env!r} played no tokens to learn from")
    pad = int(tokenizer.pad_token_id)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    device = next(model.parameters()).device
    losses: list[float] = []
    model.train()
    for _ in range(cfg.steps):
        batch = [demos[rng.randrange(len(demos))] for _ in range(cfg.batch_size)]
        width = max(len(d.tokens) for d in batch)
        tokens = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros(len(batch), width)
        for i, d in enumerate(batch):
            tokens[i, : len(d.tokens)] = torch.tensor(d.tokens)
            mask[i, : len(d.mask)] = torch.tensor(d.mask, dtype=torch.float)
        tokens, mask = tokens.to(device), mask.to(device)
        logits = model(tokens, attention_mask=(tokens != pad).long()).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
        target = mask[:, 1:]  # the log-prob at position t scores token t + 1
        loss = -(logp * target).sum() / target.sum().clamp(min=1.0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    tenth = max(len(losses) // 10, 1)
    return {
        "warmup.steps": float(cfg.steps),
        "warmup.loss_first": sum(losses[:tenth]) / tenth,
        "warmup.loss_last": sum(losses[-tenth:]) / tenth,
        "warmup.demo_reward": sum(d.reward for d in demos) / len(demos),
        "warmup.seconds": time.monotonic() - start,
    }
