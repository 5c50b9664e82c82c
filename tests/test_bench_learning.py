"""bench/learning_seeds.py and bench/variants.py without running a recipe: arguments, seeding,
the per-recipe verdicts, the tallies and tables, and the statistics read from a run's metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from astraflow.config import Recipe
from astraflow.config.base import validate_model
from bench import learning_seeds as ls
from bench import variants


def summary(**policies: dict[str, dict[str, float]]) -> dict[str, Any]:
    """A run summary with the given per-policy `reward` / `success` statistics."""
    return {"policies": {p: {"steps": 100, **stats} for p, stats in policies.items()}}


def test_arguments_default_to_twenty_seeds_of_every_cpu_recipe() -> None:
    args = ls.parse_args([])
    assert args.seeds == 20 and args.steps is None
    assert args.recipes == ls.cpu_recipes() and "referential_game" in args.recipes
    assert not any("gpu" in r for r in args.recipes)
    args = ls.parse_args(["--seeds", "3", "--recipes", "guess_number,arithmetic", "--steps", "50"])
    assert (args.seeds, args.recipes, args.steps) == (3, ["guess_number", "arithmetic"], 50)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--recipes", "arithmetic,nope"], "unknown recipes ['nope']; known: "),
        (["--seeds", "0"], "--seeds must be at least 1"),
    ],
)
def test_bad_arguments_are_refused(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        ls.parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("name", ls.cpu_recipes())
def test_a_seed_sets_every_seed_of_every_recipe(name: str) -> None:
    data = yaml.safe_load((ls.RECIPES / f"{name}.yaml").read_text())
    recipe = validate_model(Recipe, ls.seeded(data, 7), name)
    assert recipe.seed == recipe.model.seed == recipe.feeder.seed == recipe.worker.engine.args.seed == 7
    assert data.get("seed", 0) != 7  # the original is left alone


def test_a_checkpoint_model_keeps_its_weights_and_keys_are_set_on_a_copy() -> None:
    data = ls.seeded({"name": "r", "model": {"path": "/ckpt"}}, 3)
    assert "seed" not in data["model"] and data["feeder"]["seed"] == 3
    base = {"trainer": {"lr": 1.0}}
    assert ls.set_key(base, "trainer.loss.policy_loss", "m2po") == {
        "trainer": {"lr": 1.0, "loss": {"policy_loss": "m2po"}}
    }
    assert base == {"trainer": {"lr": 1.0}}


def test_every_target_names_a_policy_of_its_recipe() -> None:
    for name, targets in ls.TARGETS.items():
        policies = {p["name"] for p in yaml.safe_load((ls.RECIPES / f"{name}.yaml").read_text())["policies"]}
        assert {t.policy for t in targets} <= policies, name


def test_verdicts_follow_each_recipes_targets() -> None:
    won = {"success": {"best_tenth": 0.95}}
    assert ls.judge("referential_game", ["speaker", "listener"], summary(speaker=won, listener=won))[
        "learned"
    ]
    got = ls.judge(
        "referential_game",
        ["speaker", "listener"],
        summary(speaker=won, listener={"success": {"best_tenth": 0.85}}),
    )
    assert not got["learned"] and got["failed_targets"] == ["listener success.best_tenth >= 0.9"]
    rise = {"reward": {"p_value": 0.001, "improvement": 0.2, "last_tenth": 0.5}}
    assert ls.judge("arithmetic", ["solver"], summary(solver=rise))["learned"]
    assert not ls.judge(
        "arithmetic", ["solver"], summary(solver={"reward": {"p_value": 0.2, "improvement": 0.1}})
    )["learned"]
    verifier = {"reward": {"last_tenth": 0.95}, "balanced": {"accuracy": 0.87}}
    got = ls.judge("solve_and_verify", ["solver", "verifier"], summary(solver=rise, verifier=verifier))
    assert got["failed_targets"] == ["verifier balanced.accuracy >= 0.9"]
    assert (
        got["stats"]["verifier"]["balanced.accuracy"] == 0.87
        and "balanced.accuracy" not in got["stats"]["solver"]
    )
    verifier["balanced"]["accuracy"] = 0.91
    assert ls.judge("solve_and_verify", ["solver", "verifier"], summary(solver=rise, verifier=verifier))[
        "learned"
    ]
    # a recipe without targets learns when every policy's reward rises; a short run has no statistics
    assert ls.judge("new_recipe", ["a"], summary(a=rise))["learned"]
    assert ls.judge("new_recipe", ["a"], summary(a={"reward": {"steps": 5}}))["failed_targets"] == [
        "a reward.p_value < 0.05",
        "a reward.improvement >= 1e-09",
    ]
    crashed = ls.judge("arithmetic", ["solver"], {**summary(solver=rise), "failed": ["trainer-solver"]})
    assert not crashed["learned"] and "trainer-solver" in crashed["failed_targets"][0]


def test_the_addition_recipe_is_judged_by_its_final_checkpoints_greedy_accuracy(tmp_path: Path) -> None:
    from astraflow.models import init_checkpoint
    from trainer.checkpoint import STATE_FILE

    recipe = validate_model(Recipe, yaml.safe_load((ls.RECIPES / "addition.yaml").read_text()), "addition")
    run = tmp_path / "seed-0"
    final = run / "trainer" / "solver" / "checkpoints" / "step-00000003"
    init_checkpoint(recipe.model_for("solver"), final)
    (final / STATE_FILE).write_text("{}")  # what makes a trainer checkpoint complete
    got = ls.with_measure(summary(solver={}), run, "addition")
    untrained = got["policies"]["solver"]["greedy"]["accuracy"]
    assert 0.0 <= untrained < 0.2  # 100 sums decoded; an untrained model gets few right
    verdict = ls.judge("addition", ["solver"], got)
    assert not verdict["learned"] and verdict["failed_targets"] == ["solver greedy.accuracy >= 0.9"]
    assert verdict["stats"]["solver"]["greedy.accuracy"] == untrained
    # computed once: a rerun of the sweep reads it back from the run directory
    (run / "greedy.json").write_text(json.dumps({"accuracy": 0.95}))
    again = ls.judge("addition", ["solver"], ls.with_measure(summary(solver={}), run, "addition"))
    assert again["learned"]
    row = {"recipe": "addition", "seed": 0, "targets": [], **again}
    assert "| addition | 0 | solver | - / - / - | - / - / - | yes (greedy 0.950) |" in ls.markdown([row])


def test_solve_and_verify_is_judged_by_its_final_verifiers_balanced_accuracy(tmp_path: Path) -> None:
    from astraflow.models import init_checkpoint
    from trainer.checkpoint import STATE_FILE

    name = "solve_and_verify"
    recipe = validate_model(Recipe, yaml.safe_load((ls.RECIPES / f"{name}.yaml").read_text()), name)
    run = tmp_path / "seed-0"
    final = run / "trainer" / "verifier" / "checkpoints" / "step-00000003"
    init_checkpoint(recipe.model_for("verifier"), final)
    (final / STATE_FILE).write_text("{}")
    rise = {"reward": {"p_value": 0.001, "improvement": 0.5}}
    got = ls.with_measure(summary(solver=rise, verifier={}), run, name)
    untrained = got["policies"]["verifier"]["balanced"]["accuracy"]
    assert 0.3 <= untrained <= 0.7  # an untrained verifier tells right answers from wrong ones by chance
    verdict = ls.judge(name, ["solver", "verifier"], got)
    assert verdict["failed_targets"] == ["verifier balanced.accuracy >= 0.9"]
    assert json.loads((run / "balanced.json").read_text()) == {"accuracy": untrained}


def test_tally_and_markdown_count_seeds_per_recipe() -> None:
    results = [
        {
            "recipe": "guess_number",
            "seed": s,
            "targets": ["agent success.best_tenth >= 0.8"],
            **ls.judge("guess_number", ["agent"], summary(agent={"success": {"best_tenth": b}})),
        }
        for s, b in enumerate([0.9, 0.5, 0.85])
    ]
    tally = ls.tally(results)
    assert tally["guess_number"]["runs"] == 3 and tally["guess_number"]["learned"] == 2
    assert tally["guess_number"]["not_learned"] == [1]
    text = ls.markdown(results)
    assert "| guess_number | 2 / 3 | 1 | agent success.best_tenth >= 0.8 |" in text
    assert (
        "| guess_number | 1 | agent | - / - / - | - / - / 0.500 | no: agent success.best_tenth >= 0.8 |"
        in text
    )


def test_run_stats_read_lags_stale_drops_and_mismatch(tmp_path: Path) -> None:
    rows = [
        {
            "component": "trainer",
            "id": "trainer.agent",
            "step": step,
            "time": float(step),
            "values": {
                "reward.mean": step / 20,
                "staleness.lag.0": lag0,
                "staleness.lag.1": 8 - lag0,
                "mismatch.abs": 0.01 * step,
                "samples.stale": float(step),
                "samples.in": 20.0 * step,
            },
        }
        for step, lag0 in zip(range(1, 21), [8] * 10 + [4] * 10, strict=True)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = {
        "policies": {"agent": {"reward": {"first_tenth": 0.075, "last_tenth": 0.975, "best_tenth": 0.975}}},
        "wall_minutes": 2.0,
    }
    got = variants.run_stats(tmp_path, run, "agent")
    assert got["steps"] == 20 and got["stale"] == 20 and got["stale_share"] == pytest.approx(0.05)
    assert got["lag_share"] == {"0": 0.75, "1": 0.25} and got["lag_mean"] == pytest.approx(0.25)
    assert got["mismatch_abs"] == pytest.approx(0.105) and got["best_tenth"] == 0.975
    text = variants.table(
        "trainer.order", [{"value": "edf", "seed": 0, **got}, {"value": "edf", "seed": 1, **got}]
    )
    assert "| edf | 0 | 20 | 0.075 | 0.975 | 0.975 | 20 (5.0%) | 0.75 / 0.25 | 0.25 | 0.1050 | 2.0 |" in text
    assert "| edf | 2 | 0.075 | 0.975 | 0.975 | 5.0% | 0.25 | 0.1050 |" in text


def test_the_queue_model_runs_the_trainers_buffer_deterministically() -> None:
    from bench.batch_order import simulate

    fifo, edf = simulate("fifo", 0, steps=40), simulate("edf", 0, steps=40)
    assert simulate("edf", 0, steps=40) == edf
    for got in (fifo, edf):
        assert 0 <= got["stale_share"] < 1 and 0 <= got["lag_mean"] <= 2 and 0 < got["versions"] <= 40
