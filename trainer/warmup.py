"""Supervised warm-up before RL (`trainer.warmup`): a cold start on scripted demonstrations.

The trainer reads the `demonstrations` expert episodes that the feeder played through the recipe's
environment from `demonstrations.<policy>` (`read_demonstrations`), then takes `steps` AdamW steps
of its own (the RL optimiser's state is untouched) on batches of `batch_size` of them drawn with the
model's seed, minimising the mean negative log-likelihood of the expert's tokens (`warm_up`).
Deterministic for a recipe on one machine.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import torch

from astraflow.config import KafkaSettings
from astraflow.config.trainer import WarmupConfig
from astraflow.deadletters import DeadLetters, decode_or_deadletter
from astraflow.errors import ConfigError
from astraflow.kafka import TopicReader
from astraflow.records import Demonstration
from astraflow.topics import demonstrations

log = logging.getLogger(__name__)
WAIT_LOG_S = 10.0  # how often a trainer waiting for its demonstrations says so


def read_demonstrations(
    settings: KafkaSettings,
    policy: str,
    source: str,
    count: int,
    dead: DeadLetters,
    stopped: Callable[[], bool] = lambda: False,
) -> list[Demonstration] | None:
    """The `count` demonstrations of the set `source` from `demonstrations.<policy>`, by index,
    waiting as long as it takes for the feeder that writes them (saying so every WAIT_LOG_S);
    None when `stopped()` first. Records of another set are skipped (a topic used by an earlier
    run), undecodable ones dead-lettered."""
    found: dict[int, Demonstration] = {}
    others = 0
    group = settings.group(f"trainer.{policy}.demonstrations.{uuid.uuid4().hex[:8]}")
    with TopicReader(
        settings, [demonstrations(policy)], from_beginning=True, group=group, **{"enable.auto.commit": False}
    ) as reader:
        said = time.monotonic()
        while len(found) < count:
            if stopped():
                return None
            for msg in reader.poll_batch(0.5):
                # a record of another policy is dead-lettered by the decoder
                demo = decode_or_deadletter(msg, Demonstration, dead, frozenset({policy}))
                if demo is None:
                    continue
                if demo.source != source:
                    others += 1
                    continue
                found.setdefault(demo.index, demo)
            if time.monotonic() - said > WAIT_LOG_S:
                said = time.monotonic()
                log.warning(
                    "%s: waiting for the demonstrations of its warm-up on %s: %d of %d (set %s; %d of "
                    "other sets skipped); the feeder writes them when it starts a run",
                    policy,
                    settings.topic(demonstrations(policy)),
                    len(found),
                    count,
                    source,
                    others,
                )
    return [found[i] for i in range(count)]


def warm_up(
    model: torch.nn.Module, tokenizer: Any, demos: Sequence[Demonstration], cfg: WarmupConfig, seed: int
) -> dict[str, float]:
    """Train `model` in place on `demos`; returns what it did: the mean loss of the first and last
    tenth of the steps, the demonstrations' mean reward (the expert's own score, 1.0 for an expert
    that solves every task) and the seconds it took."""
    start = time.monotonic()
    max_len = int(getattr(model.config, "max_position_embeddings", 1 << 30))
    if long := next((d for d in demos if len(d.tokens) > max_len), None):
        raise ConfigError(
            f"demonstration {long.index} of {long.policy}'s warm-up has {len(long.tokens)} tokens, "
            f"more than the model's {max_len} positions"
        )
    if not any(d.loss_mask.any() for d in demos):
        raise ConfigError("the demonstrations of the warm-up hold no expert tokens to learn from")
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
            tokens[i, : len(d.tokens)] = torch.from_numpy(d.tokens.astype("int64"))
            mask[i, : len(d.loss_mask)] = torch.from_numpy(d.loss_mask.astype("float32"))
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
