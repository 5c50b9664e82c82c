"""Scripted demonstrations (workers/demonstrations.py, the feeder's) and the supervised warm-up on
them (trainer/warmup.py, the trainer's): what the expert plays, what the loss sees, what is refused.
tests/trainer/test_trainer_warmup.py has them travel through the broker."""

from __future__ import annotations

import itertools

import pytest
import torch

from astraflow.config import Recipe
from astraflow.errors import ConfigError
from astraflow.models import build_model, build_tokenizer
from tests.trainer.helpers import TINY
from trainer.warmup import warm_up
from workers.demonstrations import demonstration_tasks, demonstrations
from workers.envs.base import Codec
from workers.feeder import generated_tasks


def search_recipe(**trainer: object) -> Recipe:
    return Recipe.model_validate(
        {
            "name": "s",
            "policies": [{"name": "agent"}],
            "model": TINY.model_dump(),
            "feeder": {
                "env": "search",
                "env_args": {"n_entities": 4, "n_corpora": 2, "tool_latency_s": 0.05},
            },
            "trainer": {
                "warmup": {"steps": 30, "lr": 1e-2, "batch_size": 8, "demonstrations": 64},
                **trainer,
            },
        }
    )


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec(build_tokenizer())


def test_the_expert_searches_then_answers_what_it_found_and_only_its_tokens_are_learned(codec: Codec) -> None:
    recipe = search_recipe()
    demos = demonstrations(recipe, "agent", codec, 24)
    assert len(demos) == 24 and all(d.reward == 1.0 for d in demos)  # the expert solves every task
    assert [(d.index, d.count, d.source) for d in demos] == [
        (i, 24, recipe.demonstration_source("agent")) for i in range(24)
    ]
    for d in demos:
        text = codec.tokenizer.decode(d.tokens.tolist())
        learned = codec.tokenizer.decode(d.tokens[d.loss_mask.astype(bool)].tolist())
        prompt, search, results, answer = text.removeprefix("<bos>").split("\n")[:4]
        attribute, _, entity = prompt.rstrip("?").partition(" of ")
        assert search == f"s {entity} {attribute}"
        assert results.split("; ")[0].startswith(f"{entity} {attribute} ")  # the fact, found
        assert answer == "a " + results.split("; ")[0].split()[2]
        assert learned == f"{search}\n{answer}\n"  # the expert's two lines, nothing of the environment's
    # other problems than the feeder's: the warm-up teaches searching, not RL's answers
    corpora = [
        {t.payload["corpus_seed"] for t in itertools.islice(tasks, 64)}
        for tasks in (generated_tasks(recipe), demonstration_tasks(recipe))
    ]
    assert corpora[1] and corpora[0].isdisjoint(corpora[1])


def test_recipes_that_cannot_be_demonstrated_are_refused_with_the_reason(codec: Codec) -> None:
    no_expert = search_recipe().model_copy(
        update={"feeder": search_recipe().feeder.model_copy(update={"env": "arithmetic", "env_args": {}})}
    )
    with pytest.raises(ConfigError, match="environment 'arithmetic' has no expert"):
        demonstrations(no_expert, "agent", codec, 4)
    other_workflow = search_recipe().model_copy(
        update={"worker": search_recipe().worker.model_copy(update={"workflow": "solve_and_verify"})}
    )
    with pytest.raises(ConfigError, match="workflow 'solve_and_verify'"):
        demonstrations(other_workflow, "agent", codec, 4)
    recipe = search_recipe()
    assert recipe.trainer.warmup is not None
    short = build_model(TINY, codec.tokenizer)
    short.config.max_position_embeddings = 20
    with pytest.raises(
        ConfigError, match="demonstration 0 of agent's warm-up has .* than the model's 20 positions"
    ):
        warm_up(
            short, codec.tokenizer, demonstrations(recipe, "agent", codec, 4), recipe.trainer.warmup, seed=0
        )
    # the set's name changes with anything the demonstrations are played from
    changed = recipe.model_copy(update={"feeder": recipe.feeder.model_copy(update={"seed": 1})})
    assert changed.demonstration_source("agent") != recipe.demonstration_source("agent")


def test_the_warm_up_learns_the_experts_lines_and_repeats_itself_exactly(codec: Codec) -> None:
    recipe = search_recipe()
    assert recipe.trainer.warmup is not None
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        model = build_model(TINY, codec.tokenizer)
        demos = demonstrations(recipe, "agent", codec)
        stats = warm_up(model, codec.tokenizer, demos, recipe.trainer.warmup, seed=3)
        models.append(model)
    assert stats["warmup.demo_reward"] == 1.0 and stats["warmup.steps"] == 30
    # from a uniform guess over the vocabulary (~4.6 nats) to the expert's lines, which repeat the
    # prompt's words and the value the results show
    assert stats["warmup.loss_first"] > 3.5 and stats["warmup.loss_last"] < 0.6 * stats["warmup.loss_first"]
    for a, b in zip(models[0].state_dict().values(), models[1].state_dict().values(), strict=True):
        assert torch.equal(a, b)
