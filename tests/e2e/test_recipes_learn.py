"""The shipped CPU recipes learn: `astraflow run recipes/<name>.yaml`, unchanged, as a user runs it.

Each run trains tiny from-scratch models on 2 CPU cores for a few minutes; what is asserted is
what the README promises: the reward of the last tenth of the steps is above the first tenth's
(one-sided permutation test over the per-step means), and few samples arrive too stale to train.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.e2e.helpers import finish, run_env, start_run, summary

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.slow]


def run_recipe(name: str, tmp_path: Path, bootstrap: str) -> dict:
    run_dir = tmp_path / name
    proc = start_run(REPO / "recipes" / f"{name}.yaml", run_dir, run_env(bootstrap))
    out = finish(proc, 1500)
    assert proc.returncode == 0, out[-4000:]
    result = summary(run_dir)
    assert result["stop_reason"].startswith("every trainer reached"), result
    return result


def recipe(name: str) -> dict[str, Any]:
    """The recipe `recipes/<name>.yaml` as its YAML reads."""
    return dict(yaml.safe_load((REPO / "recipes" / f"{name}.yaml").read_text()))


def group_size(name: str) -> int:
    return int(recipe(name)["feeder"]["group_size"])


def assert_learned(policy: dict, name: str, min_gain: float, group: int) -> None:
    reward = policy["reward"]
    assert reward["p_value"] < 0.01 and reward["improvement"] >= min_gain, (name, reward)
    trained = policy["groups_trained"]
    # admission keeps the feeder within the staleness window: at most a tenth of the samples are
    # discarded as too old (before the fix, runs threw away more samples than they trained)
    assert policy["stale_dropped"] <= 0.1 * trained * group, (name, policy)


@pytest.mark.parametrize("name", ["arithmetic", "guess_number"])
def test_single_policy_recipe_learns(name: str, tmp_path: Path, kafka_bootstrap: str) -> None:
    result = run_recipe(name, tmp_path, kafka_bootstrap)
    policy = next(iter(result["policies"].values()))
    assert policy["steps"] >= recipe(name)["run"]["max_steps"] >= 400
    assert_learned(policy, name, min_gain=0.05, group=group_size(name))
    if name == "guess_number":
        # issue 12's bar: >= 0.8 success (random guesses without repeats score 0.5, binary search 1.0),
        # and a strategy, not luck: the final checkpoint's arg-max guesses find every secret but one
        assert policy["success"]["best_tenth"] >= 0.8, policy["success"]
        assert guess_greedily(tmp_path / name) >= 7 / 8


def test_search_learns_to_find_facts_after_its_warm_up(tmp_path: Path, kafka_bootstrap: str) -> None:
    # the trainer first imitates the environment's expert on other corpora (trainer.warmup), which
    # leaves the policy finding the fact in ~10% of its sampled episodes; RL must take it further.
    # Over seeds 0-11 (bench.learning_seeds): 0.06-0.14 -> 0.11-0.44 in the last tenth, p <= 0.027,
    # the smallest rise +0.047 (seed 9; the next +0.11); a policy that does not learn rises ~0.
    result = run_recipe("search", tmp_path, kafka_bootstrap)
    policy = result["policies"]["agent"]
    assert policy["steps"] >= 200 and policy["warmup"]["warmup.demo_reward"] == 1.0, policy
    reward = policy["reward"]
    assert reward["p_value"] < 0.05 and reward["improvement"] >= 0.03, reward
    # tool latency (0.2 s a search) against a trainer that steps every ~0.3 s on a quiet machine: a
    # run alone dropped 10.9% of its samples as stale (2.2-5.3% beside other runs, where the trainer
    # is slower); a quarter still catches admission gone wrong (more samples thrown away than kept)
    assert policy["stale_dropped"] <= 0.25 * policy["groups_trained"] * group_size("search"), policy


def final_policies(run_dir: Path, policies: tuple[str, ...]) -> tuple[Any, dict[str, Any]]:
    """The codec and the last checkpoint of each policy of a finished run, in eval mode."""
    from astraflow.models import load_model
    from trainer.checkpoint import latest_checkpoint
    from workers.envs.base import Codec, load_tokenizer

    paths = {p: latest_checkpoint(run_dir / "trainer" / p / "checkpoints") for p in policies}
    assert all(paths.values()), paths
    return Codec(load_tokenizer(paths[policies[0]])), {p: load_model(paths[p]).eval() for p in policies}


def argmax(model: Any, ids: list[int]) -> int:
    """The model's most likely next token after `ids`."""
    import torch

    with torch.no_grad():
        return int(model(torch.tensor([ids])).logits[0, -1].argmax())


def guess_greedily(run_dir: Path) -> float:
    """Share of the recipe's secrets the run's last agent checkpoint finds, each guess its arg-max token."""
    import asyncio
    import itertools
    import random

    from astraflow.records import Task
    from workers.envs.guess_number import GuessNumberEnv

    codec, models = final_policies(run_dir, ("agent",))
    args = recipe("guess_number")["feeder"]["env_args"]
    env = GuessNumberEnv(**args)
    found = 0
    for spec, _ in itertools.islice(env.tasks(0), args["max_number"]):  # one epoch: every secret once
        task = Task(
            task_id="greedy", env=env.name, roles={"agent": "agent"}, prompt=spec.prompt, payload=spec.payload
        )
        state, observation = env.reset(task, codec, random.Random(0))
        ids = [codec.bos, *codec.ids(observation)]
        while True:
            guess = argmax(models["agent"], ids)
            step = asyncio.run(env.step(state, [guess], codec))
            if step.done:
                found += step.reward > 0
                break
            ids += [guess, *codec.ids(step.observation or "")]
    return found / args["max_number"]


def test_referential_game_speaker_and_listener_learn_to_communicate(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    result = run_recipe("referential_game", tmp_path, kafka_bootstrap)
    for role in ("speaker", "listener"):
        policy = result["policies"][role]
        assert policy["steps"] >= 300
        assert_learned(policy, role, min_gain=0.3, group=group_size("referential_game"))
        # chance is 50% with 2 candidates; only a protocol the two agree on gets to 90%. "Reaches":
        # the best 30 consecutive steps. The two policies chase each other, and at a constant
        # learning rate an agreed protocol can drift late in a run (one CI run fell from 0.95 to a
        # last tenth of 0.83); most of it must still be there at the end.
        success = policy["success"]
        assert success["best_tenth"] >= 0.9 and success["last_tenth"] >= 0.7, (role, success)
    # The recipe samples with common randomness (shared_randomness: speaker and listener draw with one
    # seed); the protocol itself must not need it: the final pair, playing every game greedily.
    assert play_greedily(tmp_path / "referential_game") >= 0.9


def play_greedily(run_dir: Path) -> float:
    """Success of the run's last speaker and listener checkpoints over every game of the recipe's
    symbols (ordered candidate pairs x targets), each turn its arg-max token."""
    import itertools
    import random

    from astraflow.records import Task
    from workers.envs.referential import ReferentialEnv

    codec, models = final_policies(run_dir, ("speaker", "listener"))
    speaker, listener = models["speaker"], models["listener"]
    args = recipe("referential_game")["feeder"]["env_args"]
    env = ReferentialEnv(**args)
    wins = games = 0
    for pair in itertools.permutations(args["symbols"], args["n_candidates"]):
        for target in range(len(pair)):
            task = Task(
                task_id="greedy",
                env=env.name,
                roles={"speaker": "speaker", "listener": "listener"},
                payload={"candidates": "".join(pair), "target": target},
            )
            state, seen = env.reset(task, codec, random.Random(0))
            message = argmax(speaker, [codec.bos, *codec.ids(seen)])
            before, after = env.listener_prompt(state)
            choice = argmax(listener, [codec.bos, *codec.ids(before), message, *codec.ids(after)])
            wins += env.success(state, [choice], codec)
            games += 1
    return wins / games
