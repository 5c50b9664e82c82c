"""Every recipe in recipes/ is accepted by every component that reads it: the recipe model (unknown
keys are errors naming the key and the file), the workers' registries (environments, workflows,
engines), the streams pipeline (algorithms and their arguments), and the topic spec."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow import topics
from astraflow.config import load_recipe
from streams.api import StageContext
from streams.pipeline import build_pipeline
from tests.conftest import REPO
from workers.cli import check_recipe

RECIPES = sorted((REPO / "recipes").rglob("*.yaml"))
CPU_RECIPES = {
    "addition",
    "arithmetic",
    "guess_number",
    "search",
    "solve_and_verify",
    "referential_game",
    "code",
}
GPU_RECIPES = {"qwen2.5-1.5b-math"}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_is_accepted_by_every_component(path: Path) -> None:
    recipe = load_recipe(path)
    assert recipe.name == path.stem
    check_recipe(recipe)
    build_pipeline(
        recipe.streams, StageContext(policies=recipe.policy_names, max_staleness=recipe.max_staleness)
    )
    names = {s.name for s in topics.expand(topics.load_spec(), recipe.policy_names)}
    assert {f"samples.{p}" for p in recipe.policy_names} <= names
    assert recipe.description.strip(), "say what the recipe trains and what to expect"


def test_the_cpu_and_gpu_recipes_exist() -> None:
    assert {p.stem for p in RECIPES} >= CPU_RECIPES | GPU_RECIPES
    for path in RECIPES:
        recipe = load_recipe(path)
        gpu = path.parent.name == "gpu"
        assert (recipe.name in GPU_RECIPES) == gpu
        if gpu:  # real checkpoints from a local path, served by SGLang, trained on CUDA
            assert (
                recipe.model.path
                and recipe.worker.engine.type == "sglang"
                and recipe.trainer.device == "cuda"
            )
        else:
            assert recipe.model.path is None and recipe.worker.engine.type == "torch"


def test_an_unknown_name_fails_at_load_time(tmp_path: Path) -> None:
    from astraflow.errors import ConfigError

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (REPO / "recipes" / "arithmetic.yaml").read_text().replace("env: arithmetic", "env: arithmetik")
    )
    with pytest.raises((ConfigError, KeyError, ValueError)) as info:
        check_recipe(load_recipe(bad))
    assert "arithmetik" in str(info.value) and "arithmetic" in str(info.value)  # names the known ones


def test_a_warm_up_without_demonstrations_fails_at_load_time(tmp_path: Path) -> None:
    from astraflow.errors import ConfigError

    old = (REPO / "recipes" / "arithmetic.yaml").read_text()
    assert "\ntrainer:\n" in old
    bad = tmp_path / "warm.yaml"
    bad.write_text(old.replace("\ntrainer:\n", "\ntrainer:\n  warmup: {steps: 10}\n"))
    with pytest.raises(ConfigError, match="environment 'arithmetic' has no expert"):
        check_recipe(load_recipe(bad))


def test_a_recipe_listing_group_in_its_pipeline_says_where_the_args_go(tmp_path: Path) -> None:
    from astraflow.errors import ConfigError

    old = (REPO / "recipes" / "arithmetic.yaml").read_text()
    assert "    - name: grpo\n" in old
    bad = tmp_path / "old.yaml"
    bad.write_text(
        old.replace("    - name: grpo\n", "    - {name: group, args: {timeout_s: 60}}\n    - name: grpo\n")
    )
    with pytest.raises(ConfigError) as info:
        load_recipe(bad)
    assert str(info.value) == (
        f"{bad}: streams.pipeline.0: 'group' is no longer a pipeline stage; put its args under streams.group"
    )
