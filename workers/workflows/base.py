"""Episode programs: how one task attempt turns into trajectories.

A workflow gets an `EpisodeContext` (the task, its environment, one engine per policy) and returns
`View`s: token streams with, per token, the owning policy (index into the view's policies, -1 for
prompt and environment tokens), behaviour log-prob and weight version. Most workflows return one
view per episode; one whose roles must not see each other's context (`referential_game`) returns
one per role, and one may add a view that only one role trains on (`solve_and_verify`'s
`balanced_verdicts`); the worker gives each its own deterministic traj_id in the same group.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from astraflow.config import StrictModel, validate_model
from astraflow.errors import ConfigError
from astraflow.records import Task
from workers.engines.base import GenResult, InferenceEngine, SamplingParams
from workers.envs.base import Codec, Environment, Step


@dataclass
class View:
    """One token stream of an episode (becomes one Trajectory)."""

    policies: list[str]
    tokens: list[int] = field(default_factory=list)
    owner: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    rewards: dict[str, float] = field(default_factory=dict)
    finish_reason: str = "stop"
    error: str | None = None

    def add_env(self, ids: Sequence[int]) -> None:
        """Append prompt or environment tokens (no owner, no log-prob, no version)."""
        n = len(ids)
        self.tokens.extend(int(t) for t in ids)
        self.owner.extend([-1] * n)
        self.logprobs.extend([0.0] * n)
        self.versions.extend([-1] * n)

    def add_generated(self, policy: str, result: GenResult) -> None:
        """Append a model turn, exactly as the engine produced it (never re-tokenised)."""
        n = len(result.tokens)
        self.tokens.extend(result.tokens)
        self.owner.extend([self.policies.index(policy)] * n)
        self.logprobs.extend(result.logprobs)
        self.versions.extend(result.versions)

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class EpisodeContext:
    """Everything one episode may use."""

    task: Task
    sample_index: int
    env: Environment
    codec: Codec
    engines: dict[str, InferenceEngine]
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    rng: random.Random = field(default_factory=random.Random)
    step_delay: Callable[[], float] | None = None
    """Seconds each environment step waits first: `worker.tool_latency`'s draws from a random stream
    of their own (the environment's draws from `rng` are the same with latency or without)."""
    timings: dict[str, float] = field(default_factory=lambda: {"generate_s": 0.0, "env_s": 0.0})
    generated_tokens: int = 0

    def policy(self, role: str, roles: Sequence[str]) -> str:
        """The policy that plays `role`. A single-role workflow also accepts a task with one role of
        another name (e.g. `{solver: p}` run by `agent`)."""
        if role in self.task.roles:
            return self.task.roles[role]
        if len(roles) == 1 and len(self.task.roles) == 1:
            return next(iter(self.task.roles.values()))
        raise ValueError(
            f"task {self.task.task_id} has roles {sorted(self.task.roles)} but this workflow "
            f"needs {list(roles)}"
        )

    async def generate(
        self,
        view: View,
        policy: str,
        max_tokens: int = 16,
        stop_token_ids: Sequence[int] = (),
        seed: int | None = None,
    ) -> GenResult:
        """One model turn of `policy` continuing `view`; appended to it. `seed`: the turn's own
        sampling seed (SamplingParams.seed)."""
        engine = self.engines.get(policy)
        if engine is None:
            raise ValueError(f"no engine serves policy {policy!r} in this worker")
        params = SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_tokens=max_tokens,
            stop_token_ids=tuple(stop_token_ids),
            seed=seed,
        )
        start = time.monotonic()
        result = await engine.generate(view.tokens, params)
        self.timings["generate_s"] += time.monotonic() - start
        self.generated_tokens += len(result.tokens)
        view.add_generated(policy, result)
        return result

    async def step(self, state: Any, action: list[int]) -> Step:
        start = time.monotonic()
        if self.step_delay is not None and (delay := self.step_delay()) > 0:
            await asyncio.sleep(delay)
        out = await self.env.step(state, action, self.codec)
        self.timings["env_s"] += time.monotonic() - start
        return out


class Workflow:
    """Base of every workflow. Subclasses set `name`, `roles`, `views` and implement `run`."""

    name: ClassVar[str] = ""
    roles: ClassVar[tuple[str, ...]] = ()
    #: trajectories each episode produces (an instance may set it from its arguments:
    #: solve_and_verify's `balanced_verdicts`)
    views: int = 1

    class Args(StrictModel):
        """No arguments."""

    def __init__(self, **args: Any) -> None:
        self.args = validate_model(self.Args, args, f"arguments of workflow {self.name!r}")

    def check_env(self, env: Environment) -> None:
        """Raise ConfigError if this workflow cannot run `env`."""

    async def run(self, ctx: EpisodeContext) -> list[View]:
        raise NotImplementedError


def policies_of(*policies: str) -> list[str]:
    """Distinct policies in role order (one policy may play several roles)."""
    return list(dict.fromkeys(policies))


def require(env: Environment, workflow: str, *methods: str) -> None:
    missing = [m for m in methods if not callable(getattr(env, m, None))]
    if missing:
        raise ConfigError(f"workflow {workflow!r} cannot run environment {env.name!r}: it lacks {missing}")
