"""A trainer with `trainer.warmup` against the real broker: it learns the demonstrations the
feeder's code wrote to `demonstrations.<p>` (only its recipe's set; a broken record dead-lettered),
waits for them without hanging its stop, version 0 is the initial weights every component builds
alike, the warmed weights are version 1 at step 0 with a checkpoint, they are the KL's reference,
and a restarted trainer does not warm up again."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from astraflow.config import KafkaSettings, Recipe
from astraflow.kafka import Publisher
from astraflow.records import DeadLetter, WeightVersion
from astraflow.weights import fetch_weights
from tests.conftest import MakeTopics
from tests.kafka_helpers import read_now
from tests.trainer.helpers import assert_bit_identical
from tests.trainer.synth import make_group, produce, recipe
from trainer.service import Trainer
from workers.demonstrations import publish_demonstrations

pytestmark = pytest.mark.broker


def warm_recipe(kafka: KafkaSettings) -> Recipe:
    base = recipe(kafka, batch_groups=1, warmup={"steps": 8, "batch_size": 4, "demonstrations": 16})
    data = base.model_dump()
    data["feeder"] = {"env": "search", "env_args": {"n_entities": 4, "n_corpora": 2}}
    data["trainer"]["loss"]["kl_coef"] = 0.1
    return Recipe.model_validate(data)


def bf16(path: Path) -> dict[str, torch.Tensor]:
    return {k: v.to(torch.bfloat16) for k, v in load_file(str(path / "model.safetensors")).items()}


def test_the_warmed_weights_are_version_1_the_kl_reference_and_are_not_warmed_twice(
    kafka: KafkaSettings, topics: MakeTopics, tmp_path: Path
) -> None:
    topics(["p"])
    produce(kafka, [s for g in range(3) for s in make_group("p", f"task{g}", seed=g)], "p", partition=0)
    r = warm_recipe(kafka)
    home = tmp_path / "trainer" / "p"

    # nothing on demonstrations.p yet: the trainer waits for them, and a stop ends the wait
    waiting = Trainer(r, "p", run_dir=tmp_path, settings=kafka, max_steps=2)
    stopper = threading.Timer(8.0, waiting._on_signal, args=(15, None))
    stopper.start()
    started = time.monotonic()
    assert waiting.run() == 0
    assert time.monotonic() - started < 60 and not (home / "warmup.json").exists()

    # an earlier run's set (another feeder seed) and a broken record come first on the topic
    publisher = Publisher(kafka)
    other = r.model_copy(update={"feeder": r.feeder.model_copy(update={"seed": 7})})
    assert publish_demonstrations(other, tmp_path / "other", publisher) == 16
    publisher.send_raw("demonstrations.p", b"not a record", key=b"junk")
    assert publish_demonstrations(r, tmp_path, publisher) == 16  # what the feeder does when it starts
    publisher.flush(30)
    first = Trainer(r, "p", run_dir=tmp_path, settings=kafka, max_steps=2)
    assert first.run() == 0
    dead = [
        d for d in read_now(kafka, "deadletter", DeadLetter) if d.source_topic.endswith("demonstrations.p")
    ]
    assert [(d.key, d.component) for d in dead] == [(b"junk", "trainer")]

    events = read_now(kafka, "weights", WeightVersion)
    # version 0 announced by each trainer at its start, then the warmed weights and two RL steps
    assert [(e.version, e.step) for e in events] == [(0, 0), (0, 0), (1, 0), (2, 1), (3, 2)]
    init, warmed = bf16(tmp_path / "init" / "p"), bf16(home / "warmed")
    v0 = fetch_weights(events[0], None)
    v1 = fetch_weights(events[2], v0)
    assert_bit_identical({k: v0.state[k] for k in init}, init)  # what every worker starts from
    assert_bit_identical({k: v1.state[k] for k in warmed}, warmed)
    assert any(not torch.equal(init[k], warmed[k]) for k in init)
    stats = json.loads((home / "warmup.json").read_text())
    assert stats["warmup.steps"] == 8 and stats["warmup.demo_reward"] == 1.0
    assert stats["warmup.loss_last"] < stats["warmup.loss_first"]
    state = json.loads((home / "checkpoints" / "step-00000002" / "trainer_state.json").read_text())
    assert state["version"] == 3
    reference = first.engine.ref_model
    assert reference is not None
    for k, v in load_file(str(home / "warmed" / "model.safetensors")).items():
        assert torch.equal(reference.state_dict()[k], v), k  # the KL pulls towards the warmed weights

    # a restart resumes from its checkpoint: no second warm-up, the same reference, the next version
    produce(kafka, make_group("p", "task3", seed=3), "p", partition=0)
    mtime = (home / "warmup.json").stat().st_mtime_ns
    second = Trainer(r, "p", run_dir=tmp_path, settings=kafka, max_steps=3)
    assert second.run() == 0
    assert (home / "warmup.json").stat().st_mtime_ns == mtime
    assert [e.version for e in read_now(kafka, "weights", WeightVersion)] == [0, 0, 1, 2, 3, 3, 4]
    assert second.engine.ref_model is not None
    for k, v in reference.state_dict().items():
        assert torch.equal(second.engine.ref_model.state_dict()[k], v), k
