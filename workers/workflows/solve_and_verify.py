"""`solve_and_verify`: two policies on one single-turn environment (AstraFlow's multi-agent workload).

The solver answers; the verifier reads the question and the answer and emits `y` (approve) or
anything else (reject); after a rejection the solver answers once more. One shared token stream:
`<bos>3+4=` solver `7` `?` verifier `y`, or `... ?` verifier `n` `=` solver `8`.
Rewards: solver 1 for a correct final answer; verifier 1 when its verdict matches the correctness of
the answer it judged. If one policy plays both roles, its reward is the mean of the two.

`balanced_verdicts` (workflow_args): the verifier judges only the solver's answers, mostly wrong
while the solver is untrained, so without it the verifier learns "always reject" before it can
learn to add, and then never samples `y` again (bench/RESULTS.md, "guess_number, solve_and_verify
and the full addition task"). With it each episode yields a second view, the verifier's alone:
`<bos>3+4=` answer `?` verifier verdict, where the answer (environment tokens, not trained) is the
environment's right one when the solver's first answer was wrong, and a wrong one of as many
digits (drawn with the episode's rng) when it was right. Every episode then gives the verifier one
right and one wrong answer to judge, and always rejecting earns 0.5, as always approving does. The
group holds group_size x 2 trajectories (episodes.py), the verifier's GRPO group all 2 x
group_size verdicts; the solver's samples and its retry are unchanged.

`strict_verdicts`: only `n` is a right rejection (any token but `y` and `n` is a wrong verdict, and
still sends the solver back). Balanced data alone is not enough: with every token but `y` a right
rejection, the zero-sum noise of GRPO's groups drifts the verdicts onto one of those many tokens
and `y`, one token of the alphabet, is not sampled again (bench.two_policy_sync, 300 steps: `P(y)`
0.007). Strict, the other tokens are pushed out first and `y` and `n` compete evenly; an
`entropy_target` on the verifier keeps the loser of that race sampled while it learns to add.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, cast

from astraflow.config import StrictModel
from workers.envs.base import Environment
from workers.workflows.base import EpisodeContext, View, Workflow, policies_of, require


class KnownAnswer(Protocol):
    """What `balanced_verdicts` asks of the environment besides `Environment`."""

    def answer(self, state: Any) -> str: ...
    def wrong_answer(self, state: Any, rng: Any) -> str: ...


class SolveAndVerifyWorkflow(Workflow):
    name = "solve_and_verify"
    roles = ("solver", "verifier")

    class Args(StrictModel):
        """Arguments of `solve_and_verify`."""

        balanced_verdicts: bool = False
        """Add a verifier-only view per episode showing an answer of the opposite correctness to the
        solver's first one (the module docstring), so the verifier judges as many right answers as
        wrong ones. Needs an environment that knows its answers (`answer`, `wrong_answer`)."""
        strict_verdicts: bool = False
        """Reward only `y` for a right answer and only `n` for a wrong one: any other verdict token
        is a wrong verdict (it still sends the solver back). Without it every token but `y` is a
        right rejection, and the verdicts drift onto one of those many tokens."""

    def __init__(self, **args: Any) -> None:
        super().__init__(**args)
        self.views = 2 if self.args.balanced_verdicts else 1

    def check_env(self, env: Environment) -> None:
        # any environment whose first step ends the episode works; that is checked per episode
        if self.args.balanced_verdicts:
            require(env, f"{self.name} with balanced_verdicts", "answer", "wrong_answer")

    async def _attempt(self, ctx: EpisodeContext, view: View, policy: str, state: object) -> bool:
        result = await ctx.generate(view, policy, **ctx.env.turn_params(state, ctx.codec))
        step = await ctx.step(state, result.tokens)
        if not step.done:
            raise ValueError(f"environment {ctx.env.name!r} is not single-turn: solve_and_verify needs one")
        return step.reward >= 1.0

    def _verdict_right(self, verdict: list[int], answer_right: bool, codec: Any) -> bool:
        if answer_right:
            return verdict == codec.ids("y")
        return verdict == codec.ids("n") if self.args.strict_verdicts else verdict != codec.ids("y")

    async def run(self, ctx: EpisodeContext) -> list[View]:
        solver = ctx.policy("solver", self.roles)
        verifier = ctx.policy("verifier", self.roles)
        codec = ctx.codec
        state, observation = ctx.env.reset(ctx.task, codec, ctx.rng)
        view = View(policies=policies_of(solver, verifier))
        view.add_env([codec.bos, *codec.ids(observation)])
        correct = await self._attempt(ctx, view, solver, state)
        view.add_env(codec.ids("?"))
        verdicts = [ctx.generate(view, verifier, max_tokens=1)]
        extra = None
        if self.args.balanced_verdicts:
            known = cast(KnownAnswer, ctx.env)  # check_env required these methods
            # the opposite of the solver's answer: right when it was wrong, wrong when it was right
            shown = known.wrong_answer(state, ctx.rng) if correct else known.answer(state)
            extra = View(policies=[verifier])
            extra.add_env([codec.bos, *codec.ids(observation), *codec.ids(shown), *codec.ids("?")])
            verdicts.append(ctx.generate(extra, verifier, max_tokens=1))
        # both verdicts in one engine batch
        results = await asyncio.gather(*verdicts)
        approve = results[0].tokens == codec.ids("y")
        verdict_right = self._verdict_right(results[0].tokens, correct, codec)
        if extra is not None:
            # the shown answer is right exactly when the solver's was wrong
            extra.rewards = {verifier: float(self._verdict_right(results[1].tokens, not correct, codec))}
            if results[1].finish_reason == "aborted":
                extra.finish_reason = "aborted"
        if not approve:
            view.add_env(codec.ids("="))
            correct = await self._attempt(ctx, view, solver, state)
        role_rewards = {"solver": float(correct), "verifier": float(verdict_right)}
        by_policy: dict[str, list[float]] = {}
        for role, policy in (("solver", solver), ("verifier", verifier)):
            by_policy.setdefault(policy, []).append(role_rewards[role])
        view.rewards = {p: sum(v) / len(v) for p, v in by_policy.items()}
        return [view] if extra is None else [view, extra]
