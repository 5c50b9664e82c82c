"""Workflows: token-level bookkeeping (owners, log-probs, versions), per-policy rewards, and the
trajectories an episode becomes (deterministic ids, error episodes)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from astraflow.records import Task, decode, encode
from workers.engines.base import GenResult, SamplingParams
from workers.engines.torch_engine import TorchEngine
from workers.episodes import Runtime, run_episode

from .conftest import make_recipe


class Scripted:
    """A test engine that answers with a fixed script of texts, recording the prompts it saw."""

    def __init__(self, policy: str, codec: Any, replies: list[str], version: int = 0) -> None:
        self.policy, self.codec, self.replies, self._version = policy, codec, list(replies), version
        self.prompts: list[list[int]] = []
        self.params: list[SamplingParams] = []

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, prompt: Sequence[int], params: SamplingParams) -> GenResult:
        self.prompts.append(list(prompt))
        self.params.append(params)
        ids = self.codec.ids(self.replies.pop(0))[: params.max_tokens]
        return GenResult(ids, [-0.5] * len(ids), [self._version] * len(ids), "stop")


#: guess_number with secret 6 of 8: the script "3", "7", "6" finds it on the third guess
GUESS_SIX = Task(
    task_id="g-6",
    env="guess_number",
    roles={"agent": "policy"},
    group_size=4,
    prompt="G8:",
    payload={"secret": 6, "max_number": 8},
)


def referential_task(candidates: str, target: int) -> Task:
    """A referential-game task: speaker S sees `candidates` and the target index, listener L guesses."""
    return Task(
        task_id="r",
        env="referential_game",
        roles={"speaker": "S", "listener": "L"},
        group_size=3,
        payload={"candidates": candidates, "target": target},
    )


def episode(recipe: Any, codec: Any, task: Task, engines: dict[str, Any], k: int = 0) -> list[Any]:
    trajs, _ = asyncio.run(run_episode(Runtime(recipe, codec), task, k, engines, "w", "eu"))
    return trajs


def test_agent_multi_turn_token_in_token_out(codec: Any) -> None:
    recipe = make_recipe(feeder={"env": "guess_number"})
    eng = Scripted("policy", codec, ["3", "7", "6"], version=2)
    [t] = episode(recipe, codec, GUESS_SIX, {"policy": eng}, k=1)
    assert codec.text(t.tokens.tolist()) == "<bos>G8:3>7<6"
    assert t.owner.tolist() == [-1] * 4 + [0, -1, 0, -1, 0]
    assert t.versions.tolist() == [-1] * 4 + [2, -1, 2, -1, 2]
    assert np.allclose(t.logprobs[t.owner == 0], -0.5) and (t.logprobs[t.owner < 0] == 0).all()
    # each turn saw exactly the tokens so far: observations appended, model tokens kept as they were
    assert eng.prompts[2] == t.tokens.tolist()[:-1]
    assert t.rewards == {"policy": 1.0} and t.traj_id == "g-6#0#1" and t.group_size == 4 and t.region == "eu"
    assert decode(encode(t)) == t


def solve_and_verify(group_size: int = 1, **args: Any) -> tuple[Any, Task]:
    """A solve_and_verify recipe (solver A, verifier B, `args` as its workflow_args) and its `3+4=` task."""
    worker: dict[str, Any] = {"workflow": "solve_and_verify"}
    if args:
        worker["workflow_args"] = args
    recipe = make_recipe(policies=[{"name": "A"}, {"name": "B"}], worker=worker)
    task = Task(
        task_id="s",
        env="arithmetic",
        roles={"solver": "A", "verifier": "B"},
        group_size=group_size,
        prompt="3+4=",
        payload={"answer": "7"},
    )
    return recipe, task


def test_solve_and_verify_rewards(codec: Any) -> None:
    recipe, task = solve_and_verify()
    # wrong answer, verifier rejects (right verdict), retry correct
    a, b = Scripted("A", codec, ["6", "7"]), Scripted("B", codec, ["n"])
    [t] = episode(recipe, codec, task, {"A": a, "B": b})
    assert codec.text(t.tokens.tolist()) == "<bos>3+4=6?n=7"
    assert t.policies == ["A", "B"] and t.owner.tolist() == [-1] * 5 + [0, -1, 1, -1, 0]
    assert t.rewards == {"A": 1.0, "B": 1.0}
    # correct answer, verifier rejects (wrong verdict), retry wrong
    [t] = episode(
        recipe, codec, task, {"A": Scripted("A", codec, ["7", "5"]), "B": Scripted("B", codec, ["n"])}
    )
    assert t.rewards == {"A": 0.0, "B": 0.0}
    # wrong answer approved: solver 0, verifier 0; no retry
    [t] = episode(recipe, codec, task, {"A": Scripted("A", codec, ["1"]), "B": Scripted("B", codec, ["y"])})
    assert codec.text(t.tokens.tolist()) == "<bos>3+4=1?y" and t.rewards == {"A": 0.0, "B": 0.0}


def test_solve_and_verify_balanced_verdicts_show_the_verifier_the_opposite_answer(codec: Any) -> None:
    recipe, task = solve_and_verify(group_size=4, balanced_verdicts=True)
    # the solver is wrong: the verifier's own view shows the environment's right answer, which it
    # rejects (a wrong verdict); the real episode (rejection, retry) is as without the option
    a, b = Scripted("A", codec, ["6", "7"]), Scripted("B", codec, ["n", "n"])
    real, own = episode(recipe, codec, task, {"A": a, "B": b}, k=1)
    assert codec.text(real.tokens.tolist()) == "<bos>3+4=6?n=7" and real.rewards == {"A": 1.0, "B": 1.0}
    assert codec.text(own.tokens.tolist()) == "<bos>3+4=7?n"
    assert own.policies == ["B"] and own.owner.tolist() == [-1] * 7 + [0]  # the answer is not trained
    assert own.rewards == {"B": 0.0}
    assert [real.sample_index, own.sample_index] == [2, 3] and real.group_size == own.group_size == 8
    assert [real.traj_id, own.traj_id] == ["s#0#2", "s#0#3"]
    # the solver is right: its view shows a wrong answer of one digit, which the verifier rejects
    shown = set()
    for k in range(4):
        a, b = Scripted("A", codec, ["7"]), Scripted("B", codec, ["y", "n"])
        real, own = episode(recipe, codec, task, {"A": a, "B": b}, k=k)
        assert real.rewards == {"A": 1.0, "B": 1.0}
        text = codec.text(own.tokens.tolist())
        assert text.startswith("<bos>3+4=") and text.endswith("?n") and own.rewards == {"B": 1.0}
        shown.add(text[len("<bos>3+4=") : -2])
    assert shown <= set("012345689") and len(shown) > 1  # one digit, never 7, drawn per episode
    # approving the right answer is a right verdict
    a, b = Scripted("A", codec, ["1", "7"]), Scripted("B", codec, ["n", "y"])
    _, own = episode(recipe, codec, task, {"A": a, "B": b})
    assert codec.text(own.tokens.tolist()) == "<bos>3+4=7?y" and own.rewards == {"B": 1.0}


def test_solve_and_verify_strict_verdicts_reward_only_n_as_a_rejection(codec: Any) -> None:
    def run(replies: list[str], verdicts: list[str], strict: bool) -> list[Any]:
        recipe, task = solve_and_verify(balanced_verdicts=True, strict_verdicts=strict)
        return episode(
            recipe, codec, task, {"A": Scripted("A", codec, replies), "B": Scripted("B", codec, verdicts)}
        )

    # a wrong answer rejected with `?` (not `n`): right without the option, wrong with it; the
    # solver is sent back either way
    for strict, reward in ((False, 1.0), (True, 0.0)):
        real, own = run(["6", "7"], ["?", "y"], strict)
        assert codec.text(real.tokens.tolist()) == "<bos>3+4=6??=7"
        assert real.rewards == {"A": 1.0, "B": reward} and own.rewards == {"B": 1.0}
    # `n` for a wrong answer and `y` for a right one are right verdicts in both views
    real, own = run(["7"], ["y", "n"], True)
    assert real.rewards == {"A": 1.0, "B": 1.0} and own.rewards == {"B": 1.0}
    real, own = run(["7", "7"], ["n", "1"], True)  # a right answer rejected; a wrong one met with `1`
    assert real.rewards == {"A": 1.0, "B": 0.0} and own.rewards == {"B": 0.0}


def test_solve_and_verify_refuses_unknown_options_and_answerless_environments(codec: Any) -> None:
    from astraflow.errors import ConfigError
    from workers.registry import workflow_class

    cls = workflow_class("solve_and_verify")
    assert cls().views == 1 and cls(balanced_verdicts=True).views == 2
    with pytest.raises(ConfigError, match="unknown key 'balance'"):
        cls(balance=True)
    recipe = make_recipe(
        policies=[{"name": "A"}, {"name": "B"}],
        feeder={"env": "guess_number"},
        worker={"workflow": "solve_and_verify", "workflow_args": {"balanced_verdicts": True}},
    )
    with pytest.raises(ConfigError, match="lacks \\['answer', 'wrong_answer'\\]"):
        Runtime(recipe, codec).resolve(dataclasses.replace(GUESS_SIX, roles={"solver": "A", "verifier": "B"}))


def test_referential_game_keeps_views_apart(codec: Any) -> None:
    recipe = make_recipe(policies=[{"name": "S"}, {"name": "L"}], feeder={"env": "referential_game"})
    task = referential_task("ABCD", target=2)
    s, li = Scripted("S", codec, ["q"]), Scripted("L", codec, ["C"])
    said, heard = episode(recipe, codec, task, {"S": s, "L": li}, k=1)
    assert codec.text(said.tokens.tolist()) == "<bos>ABCD>C:q"
    assert codec.text(heard.tokens.tolist()) == "<bos>ABCD|q:C"
    assert codec.text(li.prompts[0]) == "<bos>ABCD|q:"  # the listener never saw the target
    assert heard.owner.tolist()[-3:] == [-1, -1, 0]  # the message is an environment token for the listener
    assert said.rewards == {"S": 1.0} and heard.rewards == {"L": 1.0}
    assert [said.sample_index, heard.sample_index] == [2, 3] and said.group_size == 6
    assert [said.traj_id, heard.traj_id] == ["r#0#2", "r#0#3"]


def test_referential_shared_randomness_gives_both_turns_one_seed_per_episode(codec: Any) -> None:
    task = referential_task("AB", target=0)
    seeds = []
    for shared in (True, False):
        recipe = make_recipe(
            policies=[{"name": "S"}, {"name": "L"}],
            feeder={"env": "referential_game", "env_args": {"shared_randomness": shared}},
        )
        for k in (0, 1, 1):
            s, li = Scripted("S", codec, ["q"]), Scripted("L", codec, ["A"])
            episode(recipe, codec, task, {"S": s, "L": li}, k=k)
            assert s.params[0].seed == li.params[0].seed  # the speaker's and the listener's turn share it
            seeds.append(s.params[0].seed)
    # one seed per episode, the same when the episode is replayed, none unless asked for
    assert seeds[0] is not None and seeds[0] != seeds[1] == seeds[2] and seeds[3:] == [None] * 3


def test_one_workers_policies_sample_with_their_own_stable_seeds() -> None:
    from workers.startup import sampler_seed

    assert sampler_seed("worker-0", "speaker") != sampler_seed("worker-0", "listener")
    assert sampler_seed("worker-0", "speaker") != sampler_seed("worker-1", "speaker")
    # the same in another process with another hash salt (Python's str hash is salted per process)
    code = "from workers.startup import sampler_seed; print(sampler_seed('worker-0', 'speaker'))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "123"},
    ).stdout
    assert int(out) == sampler_seed("worker-0", "speaker")


def test_failing_episode_yields_error_trajectories(codec: Any) -> None:
    recipe = make_recipe()
    task = Task(task_id="bad", env="arithmetic", roles={"agent": "policy"}, prompt="1+1=", payload={})
    [t] = episode(recipe, codec, task, {"policy": Scripted("policy", codec, ["2"])})
    assert t.finish_reason == "error" and "answer" in t.error and t.rewards == {"policy": 0.0}


@pytest.mark.slow
def test_every_builtin_env_runs_on_the_torch_engine(codec: Any, tiny_checkpoint: Path) -> None:
    import itertools

    from workers.registry import environment_class

    async def main() -> None:
        engine = TorchEngine("policy", str(tiny_checkpoint), seed=0)
        for name in ("arithmetic", "guess_number", "search", "code"):
            recipe = make_recipe(feeder={"env": name})
            env = environment_class(name)()
            spec, attempt = next(itertools.islice(env.tasks(0), 0, None))
            task = Task(
                task_id=spec.key,
                env=name,
                roles={"agent": "policy"},
                group_size=2,
                prompt=spec.prompt,
                payload=spec.payload,
                attempt=attempt,
            )
            runtime = Runtime(recipe, codec)
            results = await asyncio.gather(
                *(run_episode(runtime, task, k, {"policy": engine}, "w", "r") for k in range(2))
            )
            for trajs, tokens in results:
                [t] = trajs
                assert t.finish_reason in ("stop", "length"), (name, t.error)
                assert tokens == int((t.owner == 0).sum()) > 0
                assert (t.versions[t.owner == 0] == 0).all() and (t.logprobs[t.owner == 0] < 0).all()
                decode(encode(t))
        await engine.close()

    asyncio.run(main())


def test_tool_latency_delays_every_environment_step_by_the_episodes_own_draws(
    codec: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`worker.tool_latency`: each environment step of an episode waits a lognormal delay drawn from a
    stream of the episode's own (task, attempt, episode): the same delays wherever it runs, and the
    same trajectory as without latency."""
    from astraflow.config.worker import ToolLatency

    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def fake_sleep(delay: float, *args: Any) -> None:
        slept.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)

    def run(latency: dict[str, float], k: int = 1) -> tuple[Any, list[float]]:
        slept.clear()
        recipe = make_recipe(feeder={"env": "guess_number"}, worker={"tool_latency": latency})
        [t] = episode(recipe, codec, GUESS_SIX, {"policy": Scripted("policy", codec, ["3", "7", "6"])}, k=k)
        return t, list(slept)

    plain, none = run({})
    assert none == []  # off by default: no sleep at all
    t1, d1 = run({"median_s": 0.05, "sigma": 1.2})
    t2, d2 = run({"median_s": 0.05, "sigma": 1.2})
    assert len(d1) == 3 and d1 == d2 and len(set(d1)) == 3  # one draw per step, the episode's own
    assert run({"median_s": 0.05, "sigma": 1.2}, k=2)[1] != d1  # another episode, other delays
    assert codec.text(t1.tokens.tolist()) == codec.text(plain.tokens.tolist())
    assert t1.timings["env_s"] >= 0 and t1.rewards == plain.rewards
    assert run({"median_s": 0.05})[1] == [0.05] * 3  # sigma 0: a constant delay
    assert max(run({"median_s": 0.05, "sigma": 5.0, "max_s": 0.2})[1]) <= 0.2  # capped
    # the distribution: median and tail as documented (p99/p50 = e^(2.33 sigma), 16 at sigma 1.2)
    import random

    draws = sorted(ToolLatency(median_s=0.05, sigma=1.2).draw(random.Random(i)) for i in range(4000))
    p50, p99 = draws[2000], draws[3960]
    assert 0.045 < p50 < 0.056 and 11 < p99 / p50 < 24
