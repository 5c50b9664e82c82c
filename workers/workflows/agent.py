"""`agent`: one policy against one environment, single- or multi-turn, token-in token-out.

The prompt is <bos> plus the environment's first observation; each turn the policy generates with the
environment's limits, the environment answers, and its observation is appended as tokens. The episode
ends when the environment says so, or when the context is full (finish reason `length`).
"""

from __future__ import annotations

from workers.workflows.base import EpisodeContext, View, Workflow


class AgentWorkflow(Workflow):
    name = "agent"
    roles = ("agent",)

    async def run(self, ctx: EpisodeContext) -> list[View]:
        policy = ctx.policy("agent", self.roles)
        codec = ctx.codec
        state, observation = ctx.env.reset(ctx.task, codec, ctx.rng)
        view = View(policies=[policy], rewards={policy: 0.0})
        view.add_env([codec.bos, *codec.ids(observation)])
        while True:
            result = await ctx.generate(view, policy, **ctx.env.turn_params(state, codec))
            if result.finish_reason == "aborted":
                view.finish_reason = "aborted"
                return [view]
            if not result.tokens:  # no room left in the context
                view.finish_reason = "length"
                return [view]
            step = await ctx.step(state, result.tokens)
            if step.done:
                view.rewards[policy] = step.reward
                if step.info.get("truncated"):
                    view.finish_reason = "length"
                return [view]
            view.add_env(codec.ids(step.observation or ""))
