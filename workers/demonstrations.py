"""Scripted demonstrations for a policy's supervised warm-up (`trainer.warmup`, trainer/warmup.py).

An environment that knows how to solve its own tasks implements `expert(state)`: the text of the
next action. `demonstrations` plays that expert through the environment, turn by turn, exactly as
the `agent` workflow plays a policy: `<bos>` and the first observation, then each action (stop
character included) and the observation that answers it. The loss mask marks the expert's tokens,
the tokens a policy would generate. The tasks come from the environment's own generator at
another seed than the feeder's, so the warm-up teaches the skill, not the answers RL is scored on.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from dataclasses import dataclass

from astraflow.config import Recipe
from astraflow.errors import ConfigError
from astraflow.records import Task
from workers.envs.base import Codec, Environment
from workers.feeder import generated_tasks
from workers.registry import environment_class, workflow_class

#: added to feeder.seed for the demonstrations' tasks: problems other than the ones RL trains on
SEED_OFFSET = 1_000_003
MAX_TURNS = 64  # an expert that never ends its episode is a bug, not a long demonstration


@dataclass
class Demonstration:
    tokens: list[int]
    mask: list[int]  # 1 on the expert's tokens (the loss), 0 on <bos>, prompt and observations
    reward: float


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


def demonstrations(recipe: Recipe, codec: Codec, count: int, max_len: int) -> list[Demonstration]:
    """`count` expert episodes of the recipe's environment, each at most `max_len` tokens."""
    env = check(recipe)
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
                if len(tokens) > max_len:
                    raise ConfigError(
                        f"a demonstration of {env.name!r} ({task.task_id}) has {len(tokens)} tokens, "
                        f"more than the model's {max_len} positions"
                    )
                return Demonstration(tokens, mask, step.reward)
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
