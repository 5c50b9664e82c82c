"""Scripted demonstrations for a policy's supervised warm-up (`trainer.warmup`).

An environment that knows how to solve its own tasks implements `expert(state)`: the text of the
next action. `demonstrations` plays that expert through the environment, turn by turn, exactly as
the `agent` workflow plays a policy: `<bos>` and the first observation, then each action (stop
character included) and the observation that answers it. The loss mask marks the expert's tokens,
the tokens a policy would generate. The tasks come from the environment's own generator at
another seed than the feeder's, so the warm-up teaches the skill, not the answers RL is scored on.

The feeder that starts a run plays them and writes them to `demonstrations.<policy>`
(`publish_demonstrations`); the trainer reads them from there (trainer/warmup.py), as it reads its
samples: no component imports another's code.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from astraflow.config import Recipe
from astraflow.errors import ConfigError
from astraflow.kafka import Publisher
from astraflow.records import Demonstration, Task
from astraflow.topics import demonstrations as demonstrations_topic
from workers.envs.base import Codec, Environment
from workers.feeder import generated_tasks
from workers.registry import environment_class, workflow_class

#: added to feeder.seed for the demonstrations' tasks: problems other than the ones RL trains on
SEED_OFFSET = 1_000_003
MAX_TURNS = 64  # an expert that never ends its episode is a bug, not a long demonstration

log = logging.getLogger(__name__)


def check(recipe: Recipe) -> Environment:
    """The recipe's environment, if it can be warmed up on; else a ConfigError naming why."""
    env_name = recipe.feeder.env
    env_cls = environment_class(env_name)
    workflow = recipe.worker.workflow or env_cls.default_workflow
    if workflow_class(workflow).name != "agent":
        raise ConfigError(
            f"trainer.warmup plays demonstrations as the `agent` workflow does; this recipe runs "
            f"workflow {workflow!r}"
        )
    if env_cls.expert is Environment.expert:
        raise ConfigError(
            f"trainer.warmup needs demonstrations, and environment {env_name!r} has no expert "
            "(Environment.expert) to play them"
        )
    return env_cls(**recipe.feeder.env_args)  # type: ignore[no-any-return]


def demonstration_tasks(recipe: Recipe) -> Iterator[Task]:
    """The feeder's task generator at the demonstrations' seed."""
    feeder = recipe.feeder.model_copy(update={"seed": recipe.feeder.seed + SEED_OFFSET})
    return generated_tasks(recipe.model_copy(update={"feeder": feeder}))


def demonstrations(
    recipe: Recipe, policy: str, codec: Codec, count: int | None = None
) -> list[Demonstration]:
    """`count` (default: `trainer.warmup.demonstrations` of `policy`) expert episodes of the
    recipe's environment, as the records the trainer reads."""
    env = check(recipe)
    warmup = recipe.trainer_for(policy).warmup
    if count is None:
        if warmup is None:
            raise ConfigError(f"policy {policy!r} has no trainer.warmup to play demonstrations for")
        count = warmup.demonstrations
    source = recipe.demonstration_source(policy)
    seed = recipe.feeder.seed + SEED_OFFSET
    tasks = demonstration_tasks(recipe)

    async def play(index: int) -> Demonstration:
        task = next(tasks)
        state, observation = env.reset(task, codec, random.Random(f"{seed}:{index}"))
        tokens = [codec.bos, *codec.ids(observation)]
        mask = [0] * len(tokens)
        for _ in range(MAX_TURNS):
            action = codec.ids(env.expert(state))
            tokens += action
            mask += [1] * len(action)
            step = await env.step(state, action, codec)
            if step.done:
                return Demonstration(
                    policy=policy,
                    source=source,
                    index=index,
                    count=count,
                    tokens=np.asarray(tokens, np.int32),
                    loss_mask=np.asarray(mask, np.uint8),
                    reward=float(step.reward),
                )
            ids = codec.ids(step.observation or "")
            tokens += ids
            mask += [0] * len(ids)
        raise ConfigError(f"the expert of {env.name!r} did not end {task.task_id} in {MAX_TURNS} turns")

    async def play_all() -> list[Demonstration]:
        # all at once: an environment's simulated tool latency is paid once, not per episode
        try:
            return list(await asyncio.gather(*(play(i) for i in range(count))))
        finally:
            await env.close()

    return asyncio.run(play_all())


def publish_demonstrations(recipe: Recipe, run_dir: Path, publisher: Publisher) -> int:
    """Write the demonstrations of every policy with a warm-up to its `demonstrations.<policy>`,
    keyed by set and index (the topic is compacted: writing them again replaces them); returns how
    many. The codec is the policy's own tokenizer, from the init checkpoint every component builds."""
    from astraflow.models import init_checkpoint
    from workers.envs.base import load_tokenizer

    written = 0
    for policy in recipe.policy_names:
        if recipe.trainer_for(policy).warmup is None:
            continue
        path = init_checkpoint(recipe.model_for(policy), run_dir / "init" / policy)
        demos = demonstrations(recipe, policy, Codec(load_tokenizer(path)))
        for d in demos:
            publisher.send(demonstrations_topic(policy), d, key=f"{d.source}:{d.index}")
        publisher.flush(60)
        written += len(demos)
        log.info("%d demonstrations for %s's warm-up written (set %s)", len(demos), policy, demos[0].source)
    return written
