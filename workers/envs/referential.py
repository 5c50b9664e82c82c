"""`referential_game`: a speaker sees the target among candidates and sends a message; a listener
sees the candidates and the message and picks the target. Both are rewarded 1 on success.

Run by the `referential_game` workflow, which keeps the two views apart (the listener must never see
the target). Speaker prompt `ABCD>C:`; listener prompt `ABCD|<message>:`; the listener answers with
one candidate symbol.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from pydantic import Field

from astraflow.config import StrictModel
from astraflow.records import Task
from workers.envs.base import Codec, Environment, Step, TaskSpec, cycle_pool


class ReferentialEnv(Environment):
    name = "referential_game"
    default_workflow = "referential_game"

    class Args(StrictModel):
        """Arguments of `referential_game`."""

        symbols: str = "ABCDEFGH"
        """Objects the candidates are drawn from (one character each)."""
        n_candidates: int = Field(default=4, ge=2, le=26)
        """Candidates shown in one game."""
        message_len: int = Field(default=1, ge=1, le=16)
        """Tokens in the speaker's message."""
        pool_size: int = Field(default=64, ge=1, le=100000)
        """Distinct games the generator cycles through."""
        shared_randomness: bool = False
        """Speaker and listener sample an episode with the same random numbers (one seed per episode,
        torch engine). Two untrained policies then tend to draw the same symbol, so the game's first
        wins are the speaker naming the target and the listener picking what it heard: common
        randomness breaks the symmetry between the many codes. Without it the listener settles on
        the 50% a candidate chosen without listening gives before any message means anything. The
        trained protocol does not use it (near-deterministic policies; tests play it greedily)."""

    def tasks(self, seed: int) -> Iterator[tuple[TaskSpec, int]]:
        a = self.args
        if len(set(a.symbols)) < a.n_candidates:
            raise ValueError(
                f"symbols {a.symbols!r} has fewer than n_candidates={a.n_candidates} distinct characters"
            )
        rng = random.Random(seed)
        pool, seen = [], set()
        for _ in range(a.pool_size * 20):
            cands = "".join(rng.sample(sorted(set(a.symbols)), a.n_candidates))
            target = rng.randrange(a.n_candidates)
            if (cands, target) in seen:
                continue
            seen.add((cands, target))
            pool.append(TaskSpec(key=f"{cands}-{target}", payload={"candidates": cands, "target": target}))
            if len(pool) == a.pool_size:
                break
        return cycle_pool(pool, seed)

    def reset(self, task: Task, codec: Codec, rng: random.Random) -> tuple[Any, str]:
        cands, target = task.payload.get("candidates"), task.payload.get("target")
        if not isinstance(cands, str) or not isinstance(target, int) or not 0 <= target < len(cands):
            raise ValueError("a referential task needs payload.candidates (str) and payload.target (index)")
        return {"candidates": cands, "target": target}, f"{cands}>{cands[target]}:"

    def listener_prompt(self, state: Any) -> tuple[str, str]:
        """Text before and after the message in the listener's view."""
        return f"{state['candidates']}|", ":"

    def turn_params(self, state: Any, codec: Codec) -> dict[str, Any]:
        return {"max_tokens": self.args.message_len, "stop_token_ids": ()}

    def listener_params(self, codec: Codec) -> dict[str, Any]:
        return {"max_tokens": 1, "stop_token_ids": ()}

    def success(self, state: Any, choice: list[int], codec: Codec) -> bool:
        return list(choice) == codec.ids(state["candidates"][state["target"]])

    async def step(self, state: Any, action: list[int], codec: Codec) -> Step:
        ok = self.success(state, action, codec)
        return Step(reward=1.0 if ok else 0.0, done=True, info={"success": ok})
