"""Data-parallel training under torchrun (gloo, 2 CPU processes) matches one process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from astraflow.config import KafkaSettings
from tests.conftest import REPO, MakeTopics, subprocess_env
from tests.trainer.helpers import run_check, torchrun

pytestmark = pytest.mark.slow


def run(out: Path, nproc: int, policy_loss: str = "ppo") -> None:
    run_check(str(REPO / "tests" / "trainer" / "ddp_check.py"), out, nproc, policy_loss)


@pytest.mark.parametrize("policy_loss", ["ppo", "m2po"])
def test_two_gloo_processes_compute_the_same_gradients_and_weights(tmp_path: Path, policy_loss: str) -> None:
    run(tmp_path / "one", 1, policy_loss)
    run(tmp_path / "two", 2, policy_loss)
    if (
        policy_loss == "m2po"
    ):  # the mask is cut on both ranks' tokens: the same tokens masked as in one process
        s1, s2 = (json.loads((tmp_path / d / "stats.json").read_text()) for d in ("one", "two"))
        assert 0 < s1["m2po.masked_fraction"] < 1 and s2["m2po.masked_fraction"] == s1["m2po.masked_fraction"]
        assert s2["m2po.m2"] == pytest.approx(s1["m2po.m2"], rel=1e-5)
    g1, g2 = (
        load_file(str(tmp_path / "one" / "grads.safetensors")),
        load_file(str(tmp_path / "two" / "grads.safetensors")),
    )
    assert set(g1) == set(g2)
    for k in g1:  # the same batch-wide gradient, summed in another order
        torch.testing.assert_close(g2[k], g1[k], rtol=1e-4, atol=1e-7)
    assert float((tmp_path / "two" / "loss.txt").read_text()) == pytest.approx(
        float((tmp_path / "one" / "loss.txt").read_text()), rel=1e-5
    )
    w0 = load_file(str(tmp_path / "one" / "weights.safetensors"))
    w1 = load_file(str(tmp_path / "two" / "weights.safetensors"))
    for k in w0:
        torch.testing.assert_close(w1[k], w0[k], rtol=0, atol=1e-6)


@pytest.mark.broker
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_the_trainer_under_torchrun_trains_like_one_process(
    kafka: KafkaSettings, topics: MakeTopics, tmp_path: Path, parallel: str
) -> None:
    import yaml

    from tests.kafka_helpers import read_now
    from tests.trainer.synth import make_group, produce, recipe
    from trainer.service import Trainer

    topics(["p"])
    # one partition: both trainers see the same batches in the same order
    produce(kafka, [s for g in range(6) for s in make_group("p", f"g{g}", seed=g)], "p", partition=0)
    r = recipe(kafka, batch_groups=2, lr=1e-4, parallel=parallel)
    rfile = tmp_path / "r.yaml"
    rfile.write_text(yaml.safe_dump(r.model_dump(mode="json")))

    def train(max_steps: int) -> str:
        cmd = [
            *torchrun(2),
            "-m",
            "astraflow.cli",
            "trainer",
            "--recipe",
            str(rfile),
            "--policy",
            "p",
            "--run-dir",
            str(tmp_path / "ddp"),
            "--max-steps",
            str(max_steps),
        ]
        done = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
            env=subprocess_env(OMP_NUM_THREADS="1"),
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
        return done.stdout + done.stderr

    if (
        parallel == "fsdp"
    ):  # stop after 2 steps and resume: the offsets and AdamW state come from the checkpoint
        train(2)
        assert "resumed from" in train(3)
    else:
        train(3)
    assert Trainer(r, "p", run_dir=tmp_path / "single", settings=kafka, max_steps=3).run() == 0
    ckpt = "trainer/p/checkpoints/step-00000003/model.safetensors"
    ddp, single = load_file(str(tmp_path / "ddp" / ckpt)), load_file(str(tmp_path / "single" / ckpt))
    init = load_file(str(tmp_path / "single" / "init/p/model.safetensors"))
    for k in single:
        moved = (single[k] - init[k]).abs().max()
        assert moved > 0, k
        torch.testing.assert_close(ddp[k], single[k], rtol=0, atol=float(moved) * 1e-2)
    from astraflow.records import WeightVersion

    versions = [e.version for e in read_now(kafka, "weights", WeightVersion)]
    # each run announced versions 0..3; the resumed FSDP job announced its version 2 again first
    assert sorted(versions) == sorted([0, 1, 2, 3] * 2 + ([2] if parallel == "fsdp" else []))
    trained = [
        [
            g
            for line in (tmp_path / d / "trainer/p/trained.jsonl").read_text().splitlines()
            for g in json.loads(line)["groups"]
        ]
        for d in ("ddp", "single")
    ]
    assert trained[0] == trained[1] and len(set(trained[0])) == 6  # each group once, in the same order
