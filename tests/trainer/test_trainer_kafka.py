"""The trainer against the real broker: publication, bit-exact delta chains, checkpoints that load
with plain transformers, metrics, dead letters, duplicates and staleness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from astraflow.config import KafkaSettings
from astraflow.records import DeadLetter, Metric, WeightVersion
from astraflow.weights import fetch_weights
from tests.conftest import MakeTopics
from tests.kafka_helpers import read_now
from tests.trainer.helpers import assert_bit_identical
from tests.trainer.synth import make_group, produce, recipe
from trainer.service import Trainer

pytestmark = pytest.mark.broker


def ledger(run_dir: Path, policy: str = "p") -> list[dict]:
    return [
        json.loads(line) for line in (run_dir / "trainer" / policy / "trained.jsonl").read_text().splitlines()
    ]


def checkpoint_weights(
    run_dir: Path, step: int, dtype: torch.dtype = torch.bfloat16
) -> dict[str, torch.Tensor]:
    state = load_file(
        str(run_dir / "trainer" / "p" / "checkpoints" / f"step-{step:08d}" / "model.safetensors")
    )
    return {k: v.to(dtype) for k, v in state.items()}


def test_ten_published_deltas_rebuild_the_trainers_weights_bit_for_bit(
    kafka: KafkaSettings,
    topics: MakeTopics,
    tmp_path: Path,
) -> None:
    topics(["p"])
    produce(kafka, [s for g in range(10) for s in make_group("p", f"task{g}", seed=g)], "p")
    r = recipe(kafka, batch_groups=1, keep_checkpoints=20, snapshot_every=100, lr=1e-3, compress_level=1)
    assert Trainer(r, "p", run_dir=tmp_path, settings=kafka, max_steps=10).run() == 0

    events = read_now(kafka, "weights", WeightVersion)
    assert [e.version for e in events] == list(range(11))  # version 0 at start, then one per step
    assert all(e.snapshot_version == 0 and e.delta_base == e.version - 1 for e in events[1:])
    held = fetch_weights(events[0], None)
    init = {
        k: v.to(torch.bfloat16)
        for k, v in load_file(str(tmp_path / "init" / "p" / "model.safetensors")).items()
    }
    assert_bit_identical({k: held.state[k] for k in init}, init)
    rebuilt = fetch_weights(events[10], held)  # the chain of 10 deltas on the version-0 snapshot
    published = checkpoint_weights(tmp_path, 10)  # the float32 master of step 10, as the trainer casts it
    assert_bit_identical({k: rebuilt.state[k] for k in published}, published)
    for v in (3, 7):
        assert_bit_identical(
            {k: fetch_weights(events[v], held).state[k] for k in published}, checkpoint_weights(tmp_path, v)
        )
    changed = [e.changed_fraction for e in events[1:]]
    assert all(0 < c < 1 for c in changed)
    assert sum(e.delta_bytes for e in events[1:]) < 10 * events[0].snapshot_bytes

    metrics = [m for m in read_now(kafka, "metrics", Metric) if m.component == "trainer"]
    assert [m.step for m in metrics] == list(range(1, 11))
    names = set(metrics[-1].values)
    for name in (
        "loss",
        "loss.pg",
        "clip_fraction",
        "entropy",
        "mismatch.abs",
        "mismatch.kl",
        "grad_norm",
        "lr",
        "tokens_per_s",
        "staleness.lag.0",
        "staleness.mean",
        "staleness.dropped",
        "version",
    ):
        assert name in names, name
    assert metrics[-1].values["groups.trained"] == 10 and metrics[-1].values["tokens_per_s"] > 0
    assert metrics[0].values["entropy"] > 1.0  # an untrained model over ~100 tokens is uncertain
    ledger = [
        json.loads(line) for line in (tmp_path / "trainer" / "p" / "trained.jsonl").read_text().splitlines()
    ]
    for m, entry in zip(metrics, ledger, strict=True):  # batch_groups=1: one group per step
        g = int(entry["groups"][0].split("#")[0].removeprefix("task"))
        rewards = [s.reward for s in make_group("p", f"task{g}", seed=g)]
        assert m.values["reward.mean"] == pytest.approx(sum(rewards) / len(rewards))
        assert m.values["reward.success"] == pytest.approx(sum(r >= 1.0 for r in rewards) / len(rewards))


def test_a_checkpoint_loads_with_plain_transformers_and_generates(
    kafka: KafkaSettings,
    topics: MakeTopics,
    tmp_path: Path,
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    topics(["p"])
    produce(kafka, [s for g in range(4) for s in make_group("p", f"g{g}")], "p")
    assert Trainer(recipe(kafka), "p", run_dir=tmp_path, settings=kafka, max_steps=2).run() == 0
    path = tmp_path / "trainer" / "p" / "checkpoints" / "step-00000002"
    model = AutoModelForCausalLM.from_pretrained(str(path))
    tok = AutoTokenizer.from_pretrained(str(path))
    ids = tok("3+4=", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] > ids.shape[1] and isinstance(tok.decode(out[0]), str)
    state = json.loads((path / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["version"] == 2 and set(state["buffer"]["offsets"])
    assert (path / "optimizer.safetensors").exists() and "param_groups" in json.loads(
        (path / "optimizer.json").read_text()
    )


def test_bad_records_duplicates_and_stale_samples_are_counted_not_trained(
    kafka: KafkaSettings,
    topics: MakeTopics,
    tmp_path: Path,
) -> None:
    topics(["p", "q"])
    g1, g2, g3 = make_group("p", "g1"), make_group("p", "g2"), make_group("p", "g3")
    g4 = make_group("p", "g4", version=2)
    wrong = make_group("q", "other")[:1]  # a sample of policy q on p's topic
    # one partition, so the order is fixed: g1 -> v1, g2 -> v2, then g3 (version 0) has lag 2 > 1
    produce(kafka, g1 + g1[:2] + g2 + g3 + wrong + g4, "p", partition=0, raw=(b"\x93garbage",))
    r = recipe(kafka, policies=("p", "q"), batch_groups=1).model_copy(update={"max_staleness": 1})
    trainer = Trainer(r, "p", run_dir=tmp_path, settings=kafka, max_steps=3)
    assert trainer.run() == 0
    lines = ledger(tmp_path)
    assert [(x["groups"], x["trained"], x["stale"]) for x in lines] == [
        (["g1#0"], True, 0),
        (["g2#0"], True, 0),
        (["g3#0"], False, 4),
        (["g4#0"], True, 0),
    ]
    counts = trainer.buffer.counts
    assert counts["samples.duplicate"] == 2 and counts["samples.stale"] == 4 and counts["groups.trained"] == 4
    dead = read_now(kafka, "deadletter", DeadLetter)
    assert len(dead) == 2 and all(d.component == "trainer" for d in dead)
    assert "on the topic of 'p'" in dead[0].error and dead[0].key == b"other#0"
    assert "not a msgpack record" in dead[1].error and dead[1].raw == b"\x93garbage"
    last = [m for m in read_now(kafka, "metrics", Metric) if m.component == "trainer"][-1]
    assert last.values["samples.stale"] == 4 and last.values["deadletter"] == 2
    # every event says how many groups were consumed: the all-stale g3 (no new version) is announced
    # too, so the feeder's admission control sees it consumed
    progress = [(w.version, w.groups_consumed) for w in read_now(kafka, "weights", WeightVersion)]
    assert progress[-4:] == [(1, 1), (2, 2), (2, 3), (3, 4)], progress
