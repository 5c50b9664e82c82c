"""Synthetic Samples as streams would route them: a prompt, a completion owned by the policy,
behaviour log-probs, versions and group-normalised advantages. Deterministic from a seed."""

from __future__ import annotations

import zlib

import numpy as np

from astraflow.config import KafkaSettings, ModelSpec, Recipe
from astraflow.kafka import Publisher
from astraflow.records import Sample, group_id, traj_id
from tests.trainer.helpers import TINY

VOCAB = 98  # the char tokenizer: 4 special tokens + 94 characters


def make_group(
    policy: str, task: str, size: int = 4, version: int = 0, seed: int = 0, length: int = 12, attempt: int = 0
) -> list[Sample]:
    rng = np.random.default_rng([zlib.crc32(task.encode()), seed])  # stable across processes
    rewards = rng.integers(0, 2, size).astype(np.float32)
    if rewards.min() == rewards.max():
        rewards[0] = 1.0 - rewards[0]
    adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    out = []
    for i in range(size):
        n = length + int(rng.integers(0, 5))
        prompt = 5
        tokens = np.concatenate([[1], rng.integers(4, VOCAB, n - 1)]).astype(np.int32)
        mask = np.zeros(n, np.uint8)
        mask[prompt:] = 1
        logprobs = np.where(mask, -rng.uniform(0.5, 5.0, n), 0.0).astype(np.float32)
        versions = np.where(mask, version, -1).astype(np.int32)
        out.append(
            Sample(
                policy=policy,
                traj_id=traj_id(task, attempt, i),
                group_id=group_id(task, attempt),
                task_id=task,
                env="arith",
                tokens=tokens,
                loss_mask=mask,
                logprobs=logprobs,
                versions=versions,
                advantages=(mask * adv[i]).astype(np.float32),
                reward=float(rewards[i]),
                group_size=size,
                group_samples=size,
                group_mean=float(rewards.mean()),
                group_std=float(rewards.std()),
                attempt=attempt,
            )
        )
    return out


def produce(
    settings: KafkaSettings,
    samples: list[Sample],
    policy: str,
    partition: int | None = None,
    raw: tuple[bytes, ...] = (),
) -> None:
    """Send samples keyed by group_id (all to one `partition` when given, to fix their order), then
    `raw` byte strings (malformed records)."""
    from astraflow.records import encode

    pub = Publisher(settings)
    topic = settings.topic(f"samples.{policy}")
    where = {} if partition is None else {"partition": partition}
    for s in samples:
        pub.producer.produce(topic, value=encode(s), key=s.group_id, **where)
    for value in raw:
        pub.producer.produce(topic, value=value, key=b"raw", **where)
    pub.flush()


def recipe(
    kafka: KafkaSettings, policies: tuple[str, ...] = ("p",), model: ModelSpec = TINY, **trainer: object
) -> Recipe:
    base = {"batch_groups": 2, "publish_every": 1, "lr": 1e-3, "micro_batch_tokens": 64, "snapshot_every": 4}
    base.update(trainer)
    return Recipe.model_validate(
        {
            "name": "t",
            "policies": [{"name": p} for p in policies],
            "model": model.model_dump(),
            "max_staleness": 100,
            "kafka": kafka.model_dump(),
            "trainer": base,
        }
    )
