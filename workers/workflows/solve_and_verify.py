"""`solve_and_verify`: two policies on one single-turn environment (AstraFlow's multi-agent workload).

The solver answers; the verifier reads the question and the answer and emits `y` (approve) or
anything else (reject); after a rejection the solver answers once more. One shared token stream:
`<bos>3+4=` solver `7` `?` verifier `y`, or `... ?` verifier `n` `=` solver `8`.
Rewards: solver 1 for a correct final answer; verifier 1 when its verdict matches the correctness of
the answer it judged. If one policy plays both roles, its reward is the mean of the two.
"""

from __future__ import annotations

from workers.envs.base import Environment
from workers.workflows.base import EpisodeContext, View, Workflow, policies_of


class SolveAndVerifyWorkflow(Workflow):
    name = "solve_and_verify"
    roles = ("solver", "verifier")

    def check_env(self, env: Environment) -> None:
        # any environment whose first step ends the episode works; that is checked per episode
        return None

    async def _attempt(self, ctx: EpisodeContext, view: View, policy: str, state: object) -> bool:
        result = await ctx.generate(view, policy, **ctx.env.turn_params(state, ctx.codec))
        step = await ctx.step(state, result.tokens)
        if not step.done:
            raise ValueError(f"environment {ctx.env.name!r} is not single-turn: solve_and_verify needs one")
        return step.reward >= 1.0

    async def run(self, ctx: EpisodeContext) -> list[View]:
        solver = ctx.policy("solver", self.roles)
        verifier = ctx.policy("verifier", self.roles)
        codec = ctx.codec
        state, observation = ctx.env.reset(ctx.task, codec, ctx.rng)
        view = View(policies=policies_of(solver, verifier))
        view.add_env([codec.bos, *codec.ids(observation)])
        correct = await self._attempt(ctx, view, solver, state)
        view.add_env(codec.ids("?"))
        verdict = await ctx.generate(view, verifier, max_tokens=1)
        approve = verdict.tokens == codec.ids("y")
        verdict_right = approve == correct
        if not approve:
            view.add_env(codec.ids("="))
            correct = await self._attempt(ctx, view, solver, state)
        role_rewards = {"solver": float(correct), "verifier": float(verdict_right)}
        by_policy: dict[str, list[float]] = {}
        for role, policy in (("solver", solver), ("verifier", verifier)):
            by_policy.setdefault(policy, []).append(role_rewards[role])
        view.rewards = {p: sum(v) / len(v) for p, v in by_policy.items()}
        return [view]
