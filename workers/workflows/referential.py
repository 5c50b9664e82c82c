"""`referential_game`: a speaker and a listener, each with its own view of the game.

The speaker's view holds the candidates and the target; the listener's holds the candidates and the
speaker's message, copied as the speaker's own token ids (environment tokens in that view), never the
target. So each episode yields two trajectories (speaker view, listener view) in the task's group;
both are rewarded 1 when the listener picks the target.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

from workers.envs.base import Codec, Environment
from workers.workflows.base import EpisodeContext, View, Workflow, require


class ListenerGame(Protocol):
    """What the workflow asks of its environment besides `Environment` (check_env requires it)."""

    def listener_prompt(self, state: Any) -> tuple[str, str]: ...
    def listener_params(self, codec: Codec) -> dict[str, Any]: ...
    def success(self, state: Any, choice: list[int], codec: Codec) -> bool: ...


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
        game = cast(ListenerGame, env)  # check_env required these methods
        state, observation = env.reset(ctx.task, codec, ctx.rng)
        shared = getattr(env.args, "shared_randomness", False)
        seed = ctx.rng.getrandbits(62) if shared else None  # one per episode, from the episode's own rng
        said = View(policies=[speaker])
        said.add_env([codec.bos, *codec.ids(observation)])
        message = await ctx.generate(said, speaker, **env.turn_params(state, codec), seed=seed)
        heard = View(policies=[listener])
        before, after = game.listener_prompt(state)
        heard.add_env([codec.bos, *codec.ids(before)])
        heard.add_env(message.tokens)
        heard.add_env(codec.ids(after))
        choice = await ctx.generate(
            heard,
            listener,
            **game.listener_params(codec),
            seed=seed,
        )
        reward = 1.0 if game.success(state, choice.tokens, codec) else 0.0
        said.rewards = {speaker: reward}
        heard.rewards = {listener: reward}
        for view, result in ((said, message), (heard, choice)):
            if result.finish_reason == "aborted":
                view.finish_reason = "aborted"
        return [said, heard]
