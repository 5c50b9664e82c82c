"""From a Task to Trajectories: resolving its environment and workflow, running one episode, and
stamping the result with deterministic ids.

Episode k of a task whose workflow yields V views produces trajectories with sample indices
k*V .. k*V+V-1 and traj_id(task_id, attempt, index), in a group of group_size*V: a re-run of the same
task attempt (after a crash or a rebalance) produces the same ids, so downstream drops duplicates.
An episode that raises still yields its trajectories, with finish reason `error` and the message,
so a group never waits for a trajectory that will not come.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from typing import Any

import numpy as np

from astraflow.config import Recipe
from astraflow.errors import ConfigError
from astraflow.records import RecordError, Task, Trajectory, traj_id
from workers.engines.base import InferenceEngine
from workers.envs.base import Codec, Environment
from workers.registry import environment_class, workflow_class
from workers.workflows.base import EpisodeContext, View, Workflow, policies_of


class Runtime:
    """Environment and workflow instances of one worker, built on first use from the recipe."""

    def __init__(self, recipe: Recipe, codec: Codec) -> None:
        self.recipe = recipe
        self.codec = codec
        self._envs: dict[str, Environment] = {}
        self._workflows: dict[str, Workflow] = {}

    def env_args(self, name: str) -> dict[str, Any]:
        base = dict(self.recipe.feeder.env_args) if name == self.recipe.feeder.env else {}
        base.update(self.recipe.worker.env_args.get(name, {}))
        return base

    def env(self, name: str) -> Environment:
        if name not in self._envs:
            self._envs[name] = environment_class(name)(**self.env_args(name))
        return self._envs[name]

    def workflow(self, env: Environment) -> Workflow:
        name = self.recipe.worker.workflow or env.default_workflow
        if name not in self._workflows:
            self._workflows[name] = workflow_class(name)(**self.recipe.worker.workflow_args)
        wf = self._workflows[name]
        wf.check_env(env)
        return wf

    def resolve(self, task: Task) -> tuple[Environment, Workflow]:
        """Environment and workflow of a task; ConfigError (the task is dead-lettered) if unknown."""
        env = self.env(task.env)
        wf = self.workflow(env)
        missing = [r for r in wf.roles if r not in task.roles]
        if missing and not (len(wf.roles) == 1 and len(task.roles) == 1):
            raise ConfigError(
                f"task {task.task_id}: workflow {wf.name!r} needs roles {list(wf.roles)}, "
                f"the task has {sorted(task.roles)}"
            )
        return env, wf

    async def close(self) -> None:
        for env in self._envs.values():
            await env.close()


def _trajectory(
    task: Task,
    view: View,
    index: int,
    group_size: int,
    worker_id: str,
    region: str,
    timings: dict[str, float],
) -> Trajectory:
    return Trajectory(
        traj_id=traj_id(task.task_id, task.attempt, index),
        group_id=task.group_id,
        task_id=task.task_id,
        env=task.env,
        policies=view.policies,
        tokens=np.asarray(view.tokens, np.int32),
        owner=np.asarray(view.owner, np.int8),
        logprobs=np.asarray(view.logprobs, np.float32),
        versions=np.asarray(view.versions, np.int32),
        rewards=dict(view.rewards),
        finish_reason=view.finish_reason,
        error=view.error,
        group_size=group_size,
        sample_index=index,
        attempt=task.attempt,
        worker_id=worker_id,
        region=region,
        timings=timings,
    )


def _error_views(task: Task, wf: Workflow, codec: Codec, error: str) -> list[View]:
    policies = policies_of(*task.roles.values())
    views = []
    for _ in range(wf.views):
        v = View(
            policies=policies, rewards={p: 0.0 for p in policies}, finish_reason="error", error=error[:4000]
        )
        v.add_env([codec.bos])
        views.append(v)
    return views


async def run_episode(
    runtime: Runtime,
    task: Task,
    episode: int,
    engines: dict[str, InferenceEngine],
    worker_id: str,
    region: str,
) -> tuple[list[Trajectory], int]:
    """Run episode `episode` of `task`; returns its trajectories and the tokens it generated."""
    env, wf = runtime.resolve(task)
    wcfg = runtime.recipe.worker
    seed = f"{task.task_id}#{task.attempt}#{episode}"
    latency = wcfg.tool_latency
    ctx = EpisodeContext(
        task=task,
        sample_index=episode,
        env=env,
        codec=runtime.codec,
        engines=engines,
        temperature=wcfg.temperature,
        top_p=wcfg.top_p,
        top_k=wcfg.top_k,
        rng=random.Random(seed),
        step_delay=functools.partial(latency.draw, random.Random(f"{seed}#latency"))
        if latency.median_s > 0
        else None,
    )
    start = time.time()
    try:
        views = await wf.run(ctx)
        if len(views) != wf.views:
            raise RuntimeError(f"workflow {wf.name!r} returned {len(views)} views, declares {wf.views}")
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the episode's failure becomes its trajectories' finish reason
        views = _error_views(task, wf, runtime.codec, f"{type(exc).__name__}: {exc}")
    timings = {"queue_s": max(0.0, start - task.created_at), "episode_s": time.time() - start, **ctx.timings}
    out = []
    size = task.group_size * wf.views
    for v, view in enumerate(views):
        index = episode * wf.views + v
        try:
            traj = _trajectory(task, view, index, size, worker_id, region, timings)
        except RecordError as exc:  # e.g. a NaN reward from an environment: named, not sent as is
            bad = _error_views(task, wf, runtime.codec, f"invalid trajectory: {exc}")[v]
            traj = _trajectory(task, bad, index, size, worker_id, region, timings)
        out.append(traj)
    return out, ctx.generated_tokens


def refusal(task: Task, runtime: Runtime, max_group_size: int) -> str | None:
    """Why a task that decoded cannot run on this worker (its dead letter's reason), or None: a
    group larger than `worker.max_group_size`, or an environment, workflow or roles it cannot resolve."""
    if task.group_size > max_group_size:
        return (
            f"task {task.task_id}: group_size {task.group_size} "
            f"exceeds worker.max_group_size {max_group_size}"
        )
    try:
        runtime.resolve(task)
    except (ConfigError, ValueError) as exc:
        return f"task {task.task_id}: {exc}"
    return None
