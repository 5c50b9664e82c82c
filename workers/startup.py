"""What a worker is made of before it serves (workers/worker.py): its id, its settings as a member of
the consumer group on `tasks`, and one engine per policy, each with its own sampler seed, all sharing
one tokenizer."""

from __future__ import annotations

import os
import socket
import uuid
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from astraflow.config import Recipe
from astraflow.errors import ConfigError
from workers.engines import build_engine
from workers.engines.base import InferenceEngine
from workers.envs.base import Codec


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


#: How soon a worker commits the offsets of the tasks it has done (librdkafka's default is 5 s). The
#: feeder routes each task to the partition with the fewest tasks not yet committed
#: (workers/routing.py): a fast worker whose done tasks stayed uncommitted for seconds would look as
#: busy as a slow one. librdkafka sends a commit only when a stored offset has moved.
COMMIT_INTERVAL_MS = 200


def commit_token(worker_id: str) -> str:
    """What a worker's commits of `tasks` offsets carry as their metadata: its id and a nonce of this
    process, so that two processes never look like one, even under the same id. The feeder groups
    the partitions whose last commit carries the same token as one worker's (workers/routing.py).
    The id is cut to 200 characters: the broker refuses a commit whose metadata passes
    `offset.metadata.max.length` (4,096 by default)."""
    return f"{worker_id[:200]}#{uuid.uuid4().hex[:8]}"


def task_consumer_overrides(worker_id: str) -> dict[str, Any]:
    """The consumer of `tasks`: cooperative-sticky, so a worker that joins or leaves moves only the
    partitions that change hands (an eager protocol would revoke every partition of every worker and
    cancel their tasks); no static membership (`group.instance.id`), whose members leave without
    telling the group, which stalls their partitions for a session timeout on every scale-down.
    bench/workers_elastic.py measures the pauses of these choices side by side."""
    return {
        "partition.assignment.strategy": "cooperative-sticky",
        "client.id": worker_id,
        "auto.commit.interval.ms": COMMIT_INTERVAL_MS,
    }


def sampler_seed(worker_id: str, policy: str) -> int:
    """The seed of one policy's sampler in one worker: stable across processes (not Python's salted
    `hash`) and different for each policy, so two policies of a worker never draw with the same
    random numbers unless a workflow asks for it (SamplingParams.seed)."""
    return zlib.crc32(f"{worker_id}/{policy}".encode()) % 1_000_000


def build_engines(
    recipe: Recipe, policies: Iterable[str], run_dir: Path, worker_id: str
) -> tuple[Codec, dict[str, InferenceEngine]]:
    """The codec and an engine (at version 0) for each of `policies`, from their init checkpoints
    under `run_dir`/init. Every policy of one worker must share one tokenizer (token-in, token-out)."""
    from astraflow.models import init_checkpoint
    from workers.envs.base import load_tokenizer

    paths = {p: init_checkpoint(recipe.model_for(p), run_dir / "init" / p) for p in policies}
    tokenizers = {p: load_tokenizer(path) for p, path in paths.items()}
    vocabs = {tuple(sorted(t.get_vocab().items())) for t in tokenizers.values()}
    if len(vocabs) > 1:
        raise ConfigError("every policy of one worker must share one tokenizer (token-in, token-out)")
    codec = Codec(next(iter(tokenizers.values())))
    engines = {
        p: build_engine(recipe.worker.engine, p, str(path), seed=sampler_seed(worker_id, p), version=0)
        for p, path in paths.items()
    }
    return codec, engines
