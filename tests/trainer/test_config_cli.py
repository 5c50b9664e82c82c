"""The trainer's recipe section and command line: bad settings fail at load time, naming the key."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from astraflow.config import load_recipe
from astraflow.config.trainer import LossConfig, TrainerConfig
from astraflow.errors import ConfigError
from tests.conftest import REPO, subprocess_env
from trainer.engine import TrainEngine


@pytest.mark.parametrize(
    ("section", "words"),
    [
        ({"lr": 0}, "trainer.lr"),
        ({"loss": {"dual_clip": 1.0}}, "trainer.loss.dual_clip"),
        ({"loss": {"aggregation": "sum"}}, "trainer.loss.aggregation"),
        ({"loss": {"clip_lo": 0.1}}, "unknown key 'trainer.loss.clip_lo'"),
        ({"loss": {"policy_loss": "grpo"}}, "trainer.loss.policy_loss"),
        ({"loss": {"kl_estimator": "k4"}}, "trainer.loss.kl_estimator"),
        ({"loss": {"kl_in": "advantage"}}, "trainer.loss.kl_in"),
        ({"loss": {"log_ratio_clamp": 100}}, "trainer.loss.log_ratio_clamp"),
        ({"loss": {"m2_threshold": 0}}, "trainer.loss.m2_threshold"),
        (
            {"loss": {"aggregation": "constant"}},
            "trainer.loss: Value error, aggregation: constant needs norm_length",
        ),
        (
            {"loss": {"policy_loss": "gspo", "tis_cap": 2.0}},
            "trainer.loss: Value error, tis_cap applies to policy_loss: ppo only",
        ),
        ({"loss": {"policy_loss": "m2po", "dual_clip": 3.0}}, "dual_clip applies to policy_loss: ppo only"),
        ({"loss": {"m2po_threshold": 0.04}}, "unknown key 'trainer.loss.m2po_threshold'"),
        ({"weights_dtype": "int8"}, "trainer.weights_dtype"),
        ({"keep_versions": 1}, "trainer.keep_versions"),
    ],
)
def test_bad_trainer_settings_name_the_key(tmp_path: Path, section: dict, words: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "r", "trainer": section}))
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        load_recipe(path)


@pytest.mark.parametrize(
    "loss",
    [
        {"policy_loss": "ppo", "clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0, "log_ratio_clamp": 10.0},
        {"policy_loss": "ppo", "tis_cap": 2.0, "aggregation": "seq-mean-token-sum"},
        {
            "policy_loss": "gspo",
            "clip_low": 3.0e-4,
            "clip_high": 4.0e-4,
            "aggregation": "seq-mean-token-mean",
        },
        {"policy_loss": "cispo", "clip_low": 0.9, "clip_high": 4.0},
        {"policy_loss": "m2po", "m2_threshold": 0.04, "aggregation": "constant", "norm_length": 512},
        {"kl_coef": 0.01, "kl_estimator": "k1", "kl_in": "reward"},
        {"kl_coef": 0.01, "kl_estimator": "k2", "kl_in": "loss"},
    ],
    ids=lambda d: "-".join(str(v) for v in d.values()),
)
def test_each_loss_mode_parses_from_a_recipe_into_the_engine_settings(tmp_path: Path, loss: dict) -> None:
    import torch

    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "r", "trainer": {"loss": loss}}))
    cfg = load_recipe(path).trainer
    settings = TrainEngine(torch.nn.Linear(2, 2), cfg, torch.device("cpu")).settings
    for key, value in loss.items():
        assert getattr(cfg.loss, key) == value and getattr(settings, key) == value, key


@pytest.mark.parametrize(("old", "new"), [("token", "token-mean"), ("sequence", "seq-mean-token-mean")])
def test_old_aggregation_names_still_parse(tmp_path: Path, old: str, new: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "r", "trainer": {"loss": {"aggregation": old}}}))
    assert load_recipe(path).trainer.loss.aggregation == new


def test_warmup_schedule() -> None:
    import torch

    cfg = TrainerConfig(lr=1e-3, warmup_steps=4)
    engine = TrainEngine(torch.nn.Linear(2, 2), cfg, torch.device("cpu"))
    assert [engine.lr_at(s) for s in (1, 2, 4, 9)] == pytest.approx([2.5e-4, 5e-4, 1e-3, 1e-3])
    assert TrainerConfig().store_versions(max_staleness=3) == 5


def test_lr_decay_schedules() -> None:
    import torch

    def rates(**kw: object) -> list[float]:
        engine = TrainEngine(torch.nn.Linear(2, 2), TrainerConfig(lr=1e-3, **kw), torch.device("cpu"))
        return [engine.lr_at(s) for s in (1, 2, 4, 8, 12, 20)]

    # warm-up to step 4, then down to 10% at step 12, and flat after
    assert rates(warmup_steps=4, lr_decay="linear", decay_steps=12, min_lr_ratio=0.1) == pytest.approx(
        [2.5e-4, 5e-4, 1e-3, 5.5e-4, 1e-4, 1e-4]
    )
    assert rates(lr_decay="cosine", decay_steps=8) == pytest.approx(
        [1e-3 * 0.5 * (1 + math.cos(math.pi * s / 8)) for s in (1, 2, 4)] + [0.0, 0.0, 0.0]
    )
    assert rates() == pytest.approx([1e-3] * 6)


@pytest.mark.parametrize(
    ("section", "words"),
    [
        ({"lr_decay": "cosine"}, "decay_steps is required"),
        ({"lr_decay": "linear", "decay_steps": 5, "warmup_steps": 5}, "must be after warmup_steps"),
        ({"lr_decay": "exponential", "decay_steps": 5}, "trainer.lr_decay"),
    ],
)
def test_bad_lr_decay_is_refused(tmp_path: Path, section: dict, words: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "r", "trainer": section}))
    with pytest.raises(ConfigError, match=words):
        load_recipe(path)


def test_cli_names_an_unknown_policy(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "r", "policies": [{"name": "solver"}]}))
    done = subprocess.run(
        [sys.executable, "-m", "astraflow.cli", "trainer", "--recipe", str(path), "--policy", "critic"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=subprocess_env(),
    )
    assert done.returncode == 1 and "unknown policy 'critic'" in done.stderr and "solver" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_readme_loss_section_is_a_valid_trainer_section() -> None:
    text = (REPO / "README.md").read_text().split("### Choosing the loss", 1)[1]
    block = yaml.safe_load(text.split("```yaml", 1)[1].split("```", 1)[0])
    loss = TrainerConfig.model_validate(block["trainer"]).loss
    assert set(block["trainer"]["loss"]) == set(LossConfig.model_fields) - {
        "entropy_coef",
        "entropy_decay_steps",
        "temperature",
    }
    assert loss == LossConfig()  # the values shown are the defaults
