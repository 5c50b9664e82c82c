"""`referential_game`: a speaker and a listener, each with its own view of the game.

The speaker's view holds the candidates and the target; the listener's holds the candidates and the
speaker's message, copied as the speaker's own token ids (environment tokens in that view), never the
target. So each episode yields two trajectories (speaker view, listener view) in the task's group;
both are rewarded 1 when the listener picks the target.
"""

from __future__ import annotations

from workers.envs.base import Environment
from workers.workflows.base import EpisodeContext, View, Workflow, require


class ReferentialWorkflow(Workflow):
    name = "referential_game"
    roles = ("speaker", "listener")
    views = 2

    def check_env(self, env: Environment) -> None:
        require(env, self.name, "listener_prompt", "listener_params", "success")

    async def run(self, ctx: EpisodeContext) -> list[View]:
        speaker = ctx.policy("speaker", self.roles)
        listener = ctx.policy("listener", self.roles)
        codec, env = ctx.codec, ctx.env
        state, observation = env.reset(ctx.task, codec, ctx.rng)
        shared = getattr(env.args, "shared_randomness", False)
        seed = ctx.rng.getrandbits(62) if shared else None  # one per episode, from the episode's own rng
        said = View(policies=[speaker])
        said.add_env([codec.bos, *codec.ids(observation)])
        message = await ctx.generate(said, speaker, **env.turn_params(state, codec), seed=seed)
        heard = View(policies=[listener])
        before, after = env.listener_prompt(state)  # type: ignore[attr-defined]
        heard.add_env([codec.bos, *codec.ids(before)])
        heard.add_env(message.tokens)
        heard.add_env(codec.ids(after))
        choice = await ctx.generate(
            heard,
            listener,
            **env.listener_params(codec),  # type: ignore[attr-defined]
            seed=seed,
        )
        reward = 1.0 if env.success(state, choice.tokens, codec) else 0.0  # type: ignore[attr-defined]
        said.rewards = {speaker: reward}
        heard.rewards = {listener: reward}
        for view, result in ((said, message), (heard, choice)):
            if result.finish_reason == "aborted":
                view.finish_reason = "aborted"
        return [said, heard]
