"""`guess_number`: multi-turn; the agent guesses a secret number, the environment answers.

Prompt `G8:` (the secret is in 1..8). Each turn the model emits one token; the environment appends
`>` (the secret is higher), `<` (lower), `=` (found, episode over) or `!` (not a number in range).
Reward 1 when the secret is found within `max_turns` (minus `turn_penalty` per extra turn), else 0.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from pydantic import Field

from astraflow.config import StrictModel
from astraflow.records import Task
from workers.envs.base import Codec, Environment, Step, TaskSpec, cycle_pool


class GuessNumberEnv(Environment):
    name = "guess_number"

    class Args(StrictModel):
        """Arguments of `guess_number`."""

        max_number: int = Field(default=8, ge=2, le=9)
        """The secret is in 1..max_number (one digit, one token per guess)."""
        max_turns: int = Field(default=4, ge=1, le=32)
        """Guesses allowed."""
        turn_penalty: float = Field(default=0.0, ge=0.0, le=1.0)
        """Reward lost per guess after the first (0: plain success reward)."""

    def tasks(self, seed: int) -> Iterator[tuple[TaskSpec, int]]:
        n = self.args.max_number
        pool = [
            TaskSpec(key=f"{n}-{s}", prompt=f"G{n}:", payload={"secret": s, "max_number": n})
            for s in range(1, n + 1)
        ]
        return cycle_pool(pool, seed)

    def reset(self, task: Task, codec: Codec, rng: random.Random) -> tuple[Any, str]:
        secret = task.payload.get("secret")
        n = task.payload.get("max_number", self.args.max_number)
        if not isinstance(secret, int) or not 1 <= secret <= n:
            raise ValueError(f"payload.secret must be an integer in 1..{n}, got {secret!r}")
        return {"secret": secret, "max": n, "turns": 0}, task.prompt or f"G{n}:"

    def turn_params(self, state: Any, codec: Codec) -> dict[str, Any]:
        return {"max_tokens": 1, "stop_token_ids": (codec.eos,)}

    async def step(self, state: Any, action: list[int], codec: Codec) -> Step:
        state["turns"] += 1
        text = codec.text(action, stop_at_eos=False)
        guess = int(text) if text.isdigit() and len(text) == 1 else None
        if guess == state["secret"]:
            reward = max(0.0, 1.0 - self.args.turn_penalty * (state["turns"] - 1))
            return Step(reward=reward, done=True, info={"turns": state["turns"], "solved": True})
        if guess is None or not 1 <= guess <= state["max"]:
            reply = "!"
        else:
            reply = ">" if state["secret"] > guess else "<"
        if state["turns"] >= self.args.max_turns:
            return Step(reward=0.0, done=True, info={"turns": state["turns"], "solved": False})
        return Step(observation=reply, reward=0.0, done=False)
