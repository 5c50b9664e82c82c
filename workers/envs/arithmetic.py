"""`arithmetic`: single-turn sums, the paper's math workload in miniature.

Prompt `3+4=`; the model answers with digits. Reward 1 when the generated token ids are exactly the
answer's (then <eos> when `require_eos`), else 0, or `prefix_credit` x the share of the wanted
tokens it got right from the first on (recipes/addition.yaml). The default (`max_operand` 4, `+`
only, answers of one digit, no <eos> required) is the shape DESIGN.md reports a tiny model learns
from scratch.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from pydantic import Field

from astraflow.config import StrictModel
from astraflow.records import Task
from workers.envs.base import Codec, Environment, Step, TaskSpec, cycle_pool

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class ArithmeticEnv(Environment):
    name = "arithmetic"

    class Args(StrictModel):
        """Arguments of `arithmetic`."""

        max_operand: int = Field(default=4, ge=1, le=999)
        """Operands are drawn from 0..max_operand."""
        ops: str = "+"
        """Operators to use, among `+-*` (subtraction keeps results non-negative)."""
        require_eos: bool = False
        """Also require <eos> right after the answer (harder for a tiny model)."""
        prefix_credit: float = Field(default=0.0, ge=0.0, lt=1.0)
        """Reward of a wrong answer: this times the share of the wanted tokens (the answer's, then <eos>
        when required) it gets right from the first on, so that `1<eos>` for 14 earns a third of it.
        0 (the default) keeps the reward exact-match only."""

    def tasks(self, seed: int) -> Iterator[tuple[TaskSpec, int]]:
        pool = []
        for op in self.args.ops:
            if op not in OPS:
                raise ValueError(f"unknown operator {op!r}; known: {''.join(OPS)}")
            for a in range(self.args.max_operand + 1):
                for b in range(self.args.max_operand + 1):
                    if op == "-" and b > a:
                        continue
                    answer = str(OPS[op](a, b))
                    pool.append(
                        TaskSpec(key=f"{a}{op}{b}", prompt=f"{a}{op}{b}=", payload={"answer": answer})
                    )
        return cycle_pool(pool, seed)

    def reset(self, task: Task, codec: Codec, rng: random.Random) -> tuple[Any, str]:
        if not task.prompt or "answer" not in task.payload:
            raise ValueError("an arithmetic task needs a prompt and payload.answer")
        return {"answer": str(task.payload["answer"])}, task.prompt

    def answer(self, state: Any) -> str:
        """The right answer's text, from the task's payload (without <eos>)."""
        return str(state["answer"])

    def wrong_answer(self, state: Any, rng: random.Random) -> str:
        """A wrong answer with as many digits as the right one, uniform among them (`rng`'s draw)."""
        answer = self.answer(state)
        if not answer.isdigit():
            raise ValueError(f"no wrong answers of the shape of {answer!r}: only non-negative ones")
        low = 10 ** (len(answer) - 1) if len(answer) > 1 else 0
        pick = rng.randrange(low, 10 ** len(answer) - 1)  # one fewer: the right answer is skipped
        return str(pick + 1 if pick >= int(answer) else pick)

    def turn_params(self, state: Any, codec: Codec) -> dict[str, Any]:
        n = len(codec.ids(state["answer"]))
        return {"max_tokens": n + (1 if self.args.require_eos else 0), "stop_token_ids": (codec.eos,)}

    def correct(self, state: Any, action: list[int], codec: Codec) -> bool:
        return list(action) == self._wanted(state, codec)

    def _wanted(self, state: Any, codec: Codec) -> list[int]:
        return codec.ids(state["answer"]) + ([codec.eos] if self.args.require_eos else [])

    async def step(self, state: Any, action: list[int], codec: Codec) -> Step:
        ok = self.correct(state, action, codec)
        reward = 1.0 if ok else self.args.prefix_credit * self._prefix_share(state, action, codec)
        return Step(reward=reward, done=True, info={"correct": ok})

    def _prefix_share(self, state: Any, action: list[int], codec: Codec) -> float:
        want = self._wanted(state, codec)
        right = 0
        while right < min(len(action), len(want)) and action[right] == want[right]:
            right += 1
        return right / len(want)
