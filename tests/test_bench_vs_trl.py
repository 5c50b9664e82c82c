"""bench/vs_trl.py and its task (bench/sums.py) without TRL: its recipe translation, reward, result
parsing, report and CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from astraflow.config import load_recipe
from astraflow.models import build_tokenizer
from bench import sums, vs_trl
from workers.envs.base import Codec

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec(build_tokenizer())


def test_task_pool_is_every_single_digit_sum() -> None:
    pool = sums.task_pool()
    assert len(pool) == 100 == len({p for p, _ in pool})
    for prompt, answer in pool:
        a, b = prompt.rstrip("=").split("+")
        assert int(answer) == int(a) + int(b)


def test_completion_budget_is_two_digits_then_eos(codec: Codec) -> None:
    assert sums.max_completion_tokens(codec) == 3


def test_score_is_the_environments_reward(codec: Codec) -> None:
    eos = codec.eos
    cases = [
        (codec.ids("7") + [eos], "7", 1.0),
        (codec.ids("12") + [eos], "12", 1.0),
        (codec.ids("7"), "7", 0.0),  # no <eos>: require_eos
        (codec.ids("12"), "12", 0.0),
        (codec.ids("7") + [eos, eos], "7", 0.0),  # anything after <eos>
        (codec.ids("8") + [eos], "7", 0.0),
        (codec.ids("71") + [eos], "7", 0.0),
        ([eos], "7", 0.0),
    ]
    got = sums.score([c[0] for c in cases], [c[1] for c in cases], codec)
    assert got == [c[2] for c in cases]


def test_tenths() -> None:
    assert vs_trl.tenths([float(i) for i in range(20)]) == (0.5, 18.5)
    assert vs_trl.tenths([0.0, 1.0, 1.0]) == (0.0, 1.0)  # fewer than 10 steps: one step each
    first, last = vs_trl.tenths([])
    assert first != first and last != last  # NaN


def test_bench_recipe_is_a_valid_recipe_with_the_bench_settings(tmp_path: Path) -> None:
    base = yaml.safe_load((REPO / "recipes" / "arithmetic.yaml").read_text())
    before = json.dumps(base, sort_keys=True)
    data = vs_trl.bench_recipe(base, tmp_path / "init", 20)
    assert json.dumps(base, sort_keys=True) == before  # the base recipe is left alone
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    recipe = load_recipe(path)
    assert recipe.feeder.env == "arithmetic"
    assert recipe.feeder.env_args == {"max_operand": 9, "require_eos": True}
    assert recipe.feeder.group_size == 8 and recipe.trainer.batch_groups == 8
    assert recipe.trainer.lr == 1e-4 and recipe.trainer.lr_decay == "none"
    loss = recipe.trainer.loss
    assert loss.kl_coef == 0.0 and loss.policy_loss == "ppo" and loss.aggregation == "token-mean"
    assert (loss.clip_low, loss.clip_high) == (0.2, 0.28)
    assert (recipe.worker.temperature, recipe.worker.top_p, recipe.worker.top_k) == (1.0, 1.0, 0)
    assert recipe.model_for("solver").path == str(tmp_path / "init")
    assert recipe.run.max_steps == 20
    assert vs_trl.bench_recipe(base, tmp_path / "init", 20, lr=1e-3)["trainer"]["lr"] == 1e-3  # --lr


def test_trl_config_matches_the_astraflow_settings() -> None:
    cfg = vs_trl.trl_config(50, "/tmp/out", 3, 7)
    assert cfg["per_device_train_batch_size"] * cfg["gradient_accumulation_steps"] == 64
    assert cfg["num_generations"] == 8 and cfg["num_iterations"] == 1 and cfg["beta"] == 0.0
    assert (cfg["epsilon"], cfg["epsilon_high"]) == (0.2, 0.28)
    assert (cfg["temperature"], cfg["top_p"], cfg["top_k"]) == (1.0, 1.0, 0)
    assert cfg["learning_rate"] == 1e-4 and cfg["lr_scheduler_type"] == "constant"
    assert cfg["max_completion_length"] == 3 and cfg["max_steps"] == 50 and cfg["seed"] == 7
    assert cfg["use_cpu"] and not cfg["bf16"] and not cfg["fp16"]
    assert vs_trl.trl_config(50, "/tmp/out", 3, 7, lr=1e-3)["learning_rate"] == 1e-3  # --lr, both systems


def test_astraflow_metrics_and_final_checkpoint(tmp_path: Path) -> None:
    rows = [
        {"component": "trainer", "step": 0, "time": 1.0, "values": {}},
        {"component": "streams", "step": 1, "time": 2.0, "values": {"reward.mean": 9.0}},
    ]
    rows += [
        {"component": "trainer", "step": s, "time": 10.0 + s, "values": {"reward.mean": s / 10}}
        for s in (2, 1, 3, 4)
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    got = vs_trl.astraflow_metrics(tmp_path, 3)
    assert got == {"steps": 3, "steps_s": 2.0, "rewards": [0.1, 0.2, 0.3]}
    ckpts = tmp_path / "trainer" / "solver" / "checkpoints"
    for s in (9, 10, 2):
        (ckpts / f"step-{s:08d}").mkdir(parents=True)
    assert vs_trl.final_checkpoint(tmp_path).name == "step-00000010"
    with pytest.raises(RuntimeError, match="no trainer steps"):
        (tmp_path / "metrics.jsonl").write_text("")
        vs_trl.astraflow_metrics(tmp_path, 3)


def test_table_prints_the_ratio() -> None:
    run = {"steps": 11, "steps_s": 10.0, "rewards": [0.0] * 10 + [1.0], "greedy": 0.5}
    table = vs_trl.table(
        {"trl": {**run, "total_s": 40.0}, "astraflow": {**run, "total_s": 20.0, "steps_s": 5.0}},
        "test machine",
    )
    assert "machine: test machine" in table
    assert "astraflow/TRL speed: 2.00x whole run, 2.00x steps 2..N" in table
    trl_row = next(line for line in table.splitlines() if line.startswith("trl "))
    assert trl_row.split()[1:4] == ["11", "40.0", "17.6"]  # 704 completions / 40 s


def test_over_seeds_sums_the_times_and_compares_the_last_tenths() -> None:
    def run(total: float, steps_s: float, last: float) -> dict[str, object]:
        return {
            "steps": 10,
            "total_s": total,
            "steps_s": steps_s,
            "rewards": [0.0] * 9 + [last],
            "greedy": 0.5,
        }

    per_seed = {
        3: {"trl": run(30.0, 20.0, 0.5), "astraflow": run(20.0, 10.0, 0.6)},
        4: {"trl": run(10.0, 10.0, 0.4), "astraflow": run(20.0, 10.0, 0.3)},
    }
    out = vs_trl.over_seeds(per_seed)
    assert "over seeds 3, 4" in out
    assert "1.00x whole runs, 1.50x steps 2..N; last tenth at least TRL's in 1 of 2 seeds" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:4]}
    assert rows["trl"][3:6] == ["0.500", "0.400", "0.450"] and rows["astraflow"][3:6] == [
        "0.600",
        "0.300",
        "0.450",
    ]


def test_the_astraflow_half_is_seeded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, object]] = []

    def fake_run(what: str, argv: list[str], log: Path, env: object = None) -> float:
        seen.append(yaml.safe_load((tmp_path / "arithmetic-vs-trl.yaml").read_text()))
        raise RuntimeError("stop here")

    monkeypatch.setattr(vs_trl, "timed_run", fake_run)
    earlier = tmp_path / "astraflow" / "trainer"  # a finished run of an earlier bench in the same --work
    earlier.mkdir(parents=True)
    with pytest.raises(RuntimeError, match="stop here"):
        vs_trl.run_astraflow(tmp_path / "init", 20, 1e-4, tmp_path, seed=5)
    assert not (tmp_path / "astraflow").exists()  # a fresh run, not that one resumed
    data = seen[0]
    assert data["seed"] == 5 and data["feeder"]["seed"] == 5
    assert data["worker"]["engine"]["args"]["seed"] == 5


def test_help_runs_without_trl() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.vs_trl", "--help"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert "--steps" in out and "--trl-python" in out and "--lr" in out


class Oracle:
    """A stand-in causal LM whose greedy choice is the answer then <eos>, then junk digits
    (`wrong(prompt)` true: a wrong digit; `eos=False`: a digit where <eos> belongs)."""

    def __init__(self, codec: Codec, wrong=lambda prompt: False, eos: bool = True) -> None:
        self.codec, self.wrong, self.eos = codec, wrong, eos

    def eval(self) -> Oracle:
        return self

    def __call__(self, ids: Any) -> Any:
        import torch

        logits = torch.zeros(ids.shape[0], ids.shape[1], len(self.codec.tokenizer))
        for i, row in enumerate(ids.tolist()):
            prompt = self.codec.text(row[1:5])  # [<bos>, a, +, b, =]
            a, b = prompt.rstrip("=").split("+")
            answer = str(int(a) + int(b) + (1 if self.wrong(prompt) else 0))
            target = self.codec.ids(answer) + [self.codec.eos if self.eos else self.codec.ids("0")[0]]
            done = len(row) - 5
            logits[i, -1, target[done] if done < len(target) else self.codec.ids("5")[0]] = 1.0
        return SimpleNamespace(logits=logits)


@pytest.mark.parametrize(
    ("wrong", "eos", "accuracy"),
    [
        (lambda p: False, True, 1.0),  # junk after <eos> and past the budget is ignored
        (lambda p: p.startswith("0+"), True, 0.9),
        (lambda p: False, False, 0.0),  # no <eos>: require_eos
    ],
)
def test_greedy_accuracy_decodes_with_the_environments_budget_and_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codec: Codec, wrong: Any, eos: bool, accuracy: float
) -> None:
    import transformers

    codec.tokenizer.save_pretrained(tmp_path)
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: Oracle(codec, wrong, eos)
    )
    assert sums.greedy_accuracy(tmp_path) == pytest.approx(accuracy)
