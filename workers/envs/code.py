"""`code`: the agent writes a Python function; hidden tests in a sandbox give the reward.

Prompt: a one-line spec and the function head (`#f(x)=x*3\ndef f(x):\n return `); the model writes
the rest of the function until <eos>. The program is the head plus the model's text; the reward is the
fraction of hidden tests it passes in `workers.envs.sandbox` (bubblewrap namespaces where available;
CPU, memory and wall-clock limits, no network, a temporary directory). The sandbox only runs the
program on the test inputs: the worker compares the results, with exact types, against the expected
values. Broken, slow, forging or hostile programs score 0, and the reason is kept. A program that
does not compile scores 0 before any sandbox starts: compiling runs none of its code (CPython bounds
its constant folding), and it saves a subprocess for most of an untrained policy's programs.
"""

from __future__ import annotations

import asyncio
import random
import warnings
from collections.abc import Iterator
from typing import Any

from pydantic import Field

from astraflow.config import StrictModel
from astraflow.records import Task
from workers.envs.base import Codec, Environment, Step, TaskSpec, cycle_pool
from workers.envs.sandbox import Isolation, Limits, run_tests

HEAD = "def f(x):\n return "
INPUTS = (0, 1, 2, 5, 7, -3, 10)
FORMS = ("x+{k}", "x*{k}", "x-{k}", "x%{k}", "x//{k}", "{k}*x+1", "x*x+{k}", "max(x,{k})")


def syntax_error(source: str) -> str | None:
    """Why `source` does not compile (`SyntaxError: ...`), or None. Compiling executes nothing."""
    try:
        with warnings.catch_warnings():  # `5(x)` compiles with a SyntaxWarning: not ours to log
            warnings.simplefilter("ignore")
            compile(source, "solution.py", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:  # ValueError: a NUL byte
        return f"{type(exc).__name__}: {exc}"[:300]
    return None


class CodeEnv(Environment):
    name = "code"

    class Args(StrictModel):
        """Arguments of `code`."""

        max_tokens: int = Field(default=32, ge=1, le=4096)
        """Longest program body the model may write."""
        cpu_s: float = Field(default=Limits.cpu_s, gt=0, le=60)
        """CPU-time limit of one test run."""
        memory_mb: int = Field(default=Limits.memory_mb, ge=32, le=16384)
        """Address-space limit of the sandbox process."""
        wall_s: float = Field(default=Limits.wall_s, gt=0, le=300)
        """Wall-clock limit of one test run (the process group is killed after it)."""
        isolation: Isolation = "auto"
        """bubblewrap for the sandbox: "auto" uses it when it works and else runs unisolated with a
        warning in the log; "bwrap" scores every program 0 where it cannot run; "none" never uses it."""
        judge_latency_s: float = Field(default=0.0, ge=0.0, le=60.0)
        """Simulated latency of a remote judge, added to every test run."""

    def tasks(self, seed: int) -> Iterator[tuple[TaskSpec, int]]:
        pool = []
        for form in FORMS:
            for k in range(2, 10):
                expr = form.format(k=k)
                tests = [[[x], eval(expr, {"__builtins__": {"max": max}}, {"x": x})] for x in INPUTS]  # noqa: S307 - FORMS, ours
                pool.append(
                    TaskSpec(
                        key=expr,
                        prompt=f"#f(x)={expr}\n{HEAD}",
                        payload={"func": "f", "head": HEAD, "tests": tests},
                    )
                )
        return cycle_pool(pool, seed)

    def reset(self, task: Task, codec: Codec, rng: random.Random) -> tuple[Any, str]:
        p = task.payload
        if not isinstance(p.get("tests"), list) or not task.prompt:
            raise ValueError("a code task needs a prompt and payload.tests ([[args, expected], ...])")
        return {"func": p.get("func", "f"), "head": p.get("head", HEAD), "tests": p["tests"]}, task.prompt

    def turn_params(self, state: Any, codec: Codec) -> dict[str, Any]:
        return {"max_tokens": self.args.max_tokens, "stop_token_ids": (codec.eos,)}

    async def step(self, state: Any, action: list[int], codec: Codec) -> Step:
        source = state["head"] + codec.text(action) + "\n"
        broken = syntax_error(source)
        if broken is not None:
            # it would fail every test in the sandbox too; compiling runs none of its code, and a
            # policy that has not learned the syntax yet writes mostly such programs
            return Step(
                reward=0.0,
                done=True,
                info={
                    "passed": 0,
                    "total": len(state["tests"]),
                    "reason": broken,
                    "isolation": "not run",
                    "truncated": codec.eos not in action,
                },
            )
        limits = Limits(cpu_s=self.args.cpu_s, memory_mb=self.args.memory_mb, wall_s=self.args.wall_s)
        result = await run_tests(source, state["func"], state["tests"], limits, self.args.isolation)
        if self.args.judge_latency_s:
            await asyncio.sleep(self.args.judge_latency_s)
        return Step(
            reward=result.score,
            done=True,
            info={
                "passed": result.passed,
                "total": result.total,
                "reason": result.reason,
                "isolation": result.isolation,
                "truncated": codec.eos not in action,
            },
        )
