"""Trainer throughput (tokens/s) against a bare PyTorch loop doing the same forward, backward and
AdamW step on the same batches, measured in the same run.

The trainer runs for real: samples are produced to `samples.p` on a broker, `trainer.service`
consumes, batches, trains, checkpoints and publishes weights (every step, and every 10 steps).
Its rate is taken between the first and last step's Metric record, so start-up is excluded but
everything between steps (Kafka, decoding, grouping, collation, metrics, checkpoints, weight
store, WeightVersion events) counts. The bare loop trains a fresh copy of the same model on the
same batches in the same order (read back from the trainer's ledger) with the same loss.

    python -m bench.trainer_throughput [--steps 30] [--groups 8] [--threads N]
        # needs a broker (ASTRAFLOW_BOOTSTRAP or `astraflow broker start`)

`--threads` sets torch's threads for both (default: torch's own, one a core). `astraflow run` gives each
torch process its share of the cores (astraflow/runner/plan.py `torch_threads`): one each for a trainer
and a worker on 2 cores, where the publication thread then has a core of its own.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from pathlib import Path

import torch

from astraflow import topics as topic_spec
from astraflow.config import KafkaSettings, ModelSpec, Recipe
from astraflow.kafka import Publisher, make_admin, resolve
from astraflow.models import build_model
from astraflow.records import Metric, Sample
from bench.machine import describe
from bench.trainer_deltas import synthetic_batch
from trainer.engine import loss_settings, make_optimizer
from trainer.losses import policy_loss, token_logprobs
from trainer.rows import collate
from trainer.service import Trainer


def trainer_run(
    settings: KafkaSettings, steps: int, groups: int, publish_every: int, checkpoint_every: int | None = None
) -> tuple[float, list[list[Sample]]]:
    ns = settings.model_copy(update={"namespace": f"bench{uuid.uuid4().hex[:8]}"})
    topic_spec.apply(make_admin(ns), topic_spec.expand(topic_spec.load_spec(), ["p"], ns))
    samples: dict[str, list[Sample]] = {}
    pub = Publisher(ns)
    for step in range(1, steps + 1):
        for s in synthetic_batch(step, groups):
            samples.setdefault(s.group_id, []).append(s)
            pub.send("samples.p", s, key=s.group_id)
    pub.flush()
    recipe = Recipe.model_validate(
        {
            "name": "bench",
            "policies": [{"name": "p"}],
            "max_staleness": 10_000,
            "kafka": ns.model_dump(),
            "trainer": {
                "lr": 1e-5,
                "batch_groups": groups,
                "publish_every": publish_every,
                "checkpoint_every": checkpoint_every,
                "micro_batch_tokens": 1 << 16,
                "snapshot_every": 10,
            },
        }
    )
    with tempfile.TemporaryDirectory() as run_dir:
        Trainer(recipe, "p", run_dir=run_dir, settings=ns, max_steps=steps).run()
        ledger = [json.loads(x) for x in (Path(run_dir) / "trainer/p/trained.jsonl").read_text().splitlines()]
    metrics = _read_metrics(ns)
    tokens = sum(m.values["batch.tokens"] for m in metrics[1:])
    rate = tokens / (metrics[-1].time - metrics[0].time)
    batches = [[s for g in line["groups"] for s in samples[g]] for line in ledger]
    return rate, batches


def _read_metrics(settings: KafkaSettings) -> list[Metric]:
    from astraflow.kafka import read_to_end

    out = [m for _, m in read_to_end(settings, "metrics") if isinstance(m, Metric)]
    return sorted((m for m in out if m.component == "trainer"), key=lambda m: m.step)


def bare_loop(batches: list[list[Sample]]) -> float:
    """The same model, optimiser, loss and batches, with nothing around them."""
    from astraflow.config.trainer import TrainerConfig

    cfg = TrainerConfig(lr=1e-5)
    model = build_model(ModelSpec())
    opt = make_optimizer(list(model.parameters()), cfg)  # the trainer's own AdamW (fused)
    settings = loss_settings(cfg)
    rows = [collate(b, pad_id=0) for b in batches]
    times, tokens = [], []
    for r in rows:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        attention = (torch.arange(r.tokens.shape[1])[None, :] < r.lengths[:, None]).long()
        logits = model(input_ids=r.tokens, attention_mask=attention).logits
        logp, entropy = token_logprobs(logits, r.tokens, entropy_grad=False)
        loss, _ = policy_loss(logp, r.behaviour, r.advantages, r.mask, settings, entropy=entropy)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm or float("inf"))
        opt.step()
        times.append(time.perf_counter() - t0)
        tokens.append(int(r.lengths.sum()))
    return sum(tokens[1:]) / sum(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    settings = resolve(KafkaSettings())
    print(f"Machine: {describe()}")
    print(
        f"Tiny Qwen2 (hidden 128, 4 layers), {args.steps} steps of {args.groups} groups x 8 samples "
        f"(~{args.groups * 8 * 32} tokens/step), {torch.get_num_threads()} torch threads, "
        f"broker {settings.bootstrap}.\n"
    )
    print("| trainer setting | trainer tokens/s | bare loop tokens/s | ratio |")
    print("|---|---:|---:|---:|")
    # (publish_every, checkpoint_every): None checkpoints at every publication; the recipes publish
    # every step and checkpoint every 25
    for publish_every, checkpoint_every in ((10, None), (1, None), (1, 25)):
        rate, batches = trainer_run(settings, args.steps, args.groups, publish_every, checkpoint_every)
        bare = bare_loop(batches)
        every = "every step" if publish_every == 1 else f"every {publish_every} steps"
        what = (
            f"publish + checkpoint {every}"
            if checkpoint_every is None
            else f"publish {every}, checkpoint every {checkpoint_every} (the recipes)"
        )
        print(f"| {what} | {rate:,.0f} | {bare:,.0f} | {rate / bare:.2f} |", flush=True)


if __name__ == "__main__":
    main()
