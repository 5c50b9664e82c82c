"""`astraflow trainer --policy P`: one policy's trainer, from `samples.<P>` to `weights`.

Read top to bottom, one iteration of `run()`:
  1. poll `samples.<P>` (trainer/intake.py: partitions positioned at the offsets stored in the
     last checkpoint), decode (bad records go to `deadletter`), and add to the GroupBuffer;
  2. with lockstep, wait until every other policy has published our current version;
  3. take a batch of complete groups (stale samples dropped and counted), train one step;
  4. every `publish_every` steps: write the new version into the weight store, checkpoint it if a
     checkpoint is due (every `checkpoint_every` steps; default: at every publication), and announce
     the WeightVersion event, in the background while the next step trains (trainer/publication.py).

A version number is never given to two different weights. A trainer resumed from a checkpoint
older than the newest stored version (it crashed after publishing, before its next checkpoint)
does not roll those versions back, since workers may hold them: it publishes its weights as the
next number after the newest, and the versions in between are *lost*: samples generated with
them are dropped as stale (their lag behind the resumed weights is unknown), and the lost ranges
are kept in the checkpoints.

Under torchrun, only rank 0 runs Kafka, checkpoints and publication; see trainer/distributed.py.

Metrics (component `trainer`, one Metric per step; sums over the batch unless noted):
  step, version, loss, loss.pg, loss.kl, clip_fraction, entropy, kl_ref, mismatch.abs (mean
  |log pi - log mu| on loss tokens; pi and mu are both the sampling distribution of worker.temperature,
  top_p and top_k, so ~0 on-policy), mismatch.kl (k3 estimate of KL(mu || pi)), is_weight.mean,
  outside_support (share of loss tokens outside pi's top-p/top-k set, masked out of the loss),
  grad_norm, lr, tokens_per_s (all tokens of the batch / step time), reward.mean and reward.success
  (mean reward, and share of samples with reward >= trainer.success_threshold, over the batch's
  groups), batch.groups, batch.samples, batch.tokens, loss_tokens, staleness.lag.<k> (samples of
  this batch at lag k, k < 16; staleness.lag.ge16 for the rest), staleness.mean, staleness.dropped
  (stale samples of this batch), and running totals samples.in, samples.duplicate, samples.stale,
  samples.lost_to_retention (deleted by retention past the checkpoint before a resumed trainer read
  them), groups.trained, deadletter, wait_s (seconds with no batch). kl_ref is the estimator that
  trainer.loss.kl_estimator names. With policy_loss m2po, also m2po.m2 (mean squared log-ratio of
  the batch before masking), m2po.m2_kept (after) and m2po.masked_fraction (= its clip_fraction).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from astraflow import failpoints, gcpause
from astraflow.config import Recipe
from astraflow.config.kafka import KafkaSettings
from astraflow.deadletters import DeadLetters
from astraflow.errors import AstraFlowError, ConfigError
from astraflow.kafka import Publisher, wait_for_topics
from astraflow.metrics import MetricsReporter
from astraflow.models import init_checkpoint, load_model, load_tokenizer
from astraflow.sampling import SamplingSettings
from astraflow.topics import WEIGHTS, demonstrations, samples
from astraflow.weights import WeightStore
from trainer import checkpoint as ckpt
from trainer import distributed
from trainer.background import BackgroundJob
from trainer.batching import Batch, GroupBuffer
from trainer.engine import TrainEngine
from trainer.intake import PARTITION_CHECK_S, SampleIntake
from trainer.publication import Publication
from trainer.rows import collate

log = logging.getLogger(__name__)
#: Lags 0..15 get their own histogram bucket; larger ones share `staleness.lag.ge16`.
STALENESS_BUCKETS = 16
WARMED = "warmed"  # the warmed-up weights, in the trainer's home: the KL's reference


class TrainerError(AstraFlowError):
    """The trainer cannot run (missing topic, a weight store that lost published versions)."""


def run_dir_of(recipe: Recipe, run_dir: str | Path | None) -> Path:
    return Path(run_dir) if run_dir is not None else recipe.run_dir


def pick_device(name: str, local_rank: int) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"
    return torch.device(name)


class Trainer(Publication):
    """One policy's trainer process (one rank of it under torchrun)."""

    def __init__(
        self,
        recipe: Recipe,
        policy: str,
        run_dir: str | Path | None = None,
        settings: KafkaSettings | None = None,
        max_steps: int | None = None,
    ) -> None:
        recipe.model_for(policy)  # unknown policy: ConfigError now
        self.recipe, self.policy, self.cfg = recipe, policy, recipe.trainer_for(policy)
        self.run_dir = run_dir_of(recipe, run_dir)
        self.home = self.run_dir / "trainer" / policy
        self.max_steps = max_steps or self.cfg.max_steps or recipe.run.max_steps
        self.device = pick_device(self.cfg.device, int(os.environ.get("LOCAL_RANK", "0")))
        self.dist = distributed.init(self.device.type)
        self.settings = settings
        self.stop_requested = False
        self.step = self.version = self.batches = self.last_checkpoint = 0
        self.wait_s = 0.0  # seconds with no batch to train (the scaling advice reads it)
        self.buffer = GroupBuffer(policy, self.cfg.dedupe_window, self.cfg.order)
        self.publications = BackgroundJob(f"publish-{policy}")
        self._setup_model()

    # ------------------------------------------------------------------ setup

    def _setup_model(self) -> None:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one bar per checkpoint would drown the logs
        spec = self.recipe.model_for(self.policy)
        init_dir = Path(spec.path) if spec.path else self.run_dir / "init" / self.policy
        latest = None
        if self.dist.leader:
            # only the leader writes: under torch.distributed, transformers' save_pretrained writes
            # model files on rank 0 only, so other ranks would leave an incomplete directory
            init_checkpoint(spec, init_dir)
            latest = ckpt.latest_checkpoint(self.home / "checkpoints")
        if self.dist.enabled:  # every rank waits for the leader, then loads the checkpoint it chose
            chosen = torch.tensor([int(latest.name.split("-")[1]) if latest else -1])
            torch.distributed.broadcast(chosen, src=0, group=self.dist.group)
            latest = self.home / "checkpoints" / f"step-{int(chosen):08d}" if int(chosen) >= 0 else None
        self.tokenizer = load_tokenizer(init_dir)
        self.resumed_from = latest
        # a warm-up (trainer/warmup.py) runs once, before the first checkpoint; its weights are the
        # KL's reference, kept in `warmed` for a resumed trainer
        self.warm_pending = self.cfg.warmup is not None and latest is None
        if self.cfg.warmup is not None and self.dist.enabled:
            raise ConfigError("trainer.warmup runs in one process: not under torchrun")
        warmed = self.home / WARMED
        model = load_model(latest or init_dir, dtype="float32")
        ref_dir = warmed if self.cfg.warmup is not None and not self.warm_pending else init_dir
        ref = load_model(ref_dir, dtype="float32") if self.cfg.loss.kl_coef > 0 else None
        self.engine = TrainEngine(
            model,
            self.cfg,
            self.device,
            ref_model=ref,
            distributed=self.dist.enabled,
            pad_id=self.tokenizer.pad_token_id,
            sampling=SamplingSettings.of(self.recipe.worker),
        )
        if latest is not None:
            self.engine.load_optimizer(ckpt.read_optimizer(latest))
            state = ckpt.read_state(latest)
            self.step, self.version = state["step"], state["version"]
            self.engine.serving_published = self.version >= 1
            self.batches, self.last_checkpoint = state["batches"], state["step"]
            self.buffer.restore(state["buffer"])
            log.warning(
                "%s: resumed from %s (step %d, version %d)", self.policy, latest, self.step, self.version
            )

    def _setup_leader(self) -> None:
        settings = self.settings
        assert settings is not None
        needed = [samples(self.policy), WEIGHTS] + (
            [demonstrations(self.policy)] if self.warm_pending else []
        )
        wait_for_topics(settings, needed, stopped=lambda: self.stop_requested)
        if self.stop_requested:  # stopped before its topics existed: nothing to connect to or close
            return
        cfg = self.cfg
        self.server = None
        store_root = Path(cfg.store_dir) if cfg.store_dir else self.run_dir / "weights"
        if cfg.serve_http:  # imported here: aiohttp would add ~0.14 s to every other trainer's start
            from astraflow.weights.server import WeightServer

            self.server = WeightServer(
                store_root, cfg.http_host, cfg.http_port, advertise_host=cfg.advertise_host
            )
            self.server.start()
        self.store = WeightStore(
            store_root,
            self.policy,
            snapshot_every=cfg.snapshot_every,
            keep_versions=cfg.store_versions(self.recipe.max_staleness),
            compress_level=cfg.delta_compress_level(),
            dtype=cfg.weights_dtype,
            base_uri=self.server.url if self.server else None,
        )
        self._reconcile_store()
        self._truncate_ledger()
        self.publisher = Publisher(settings)
        self.dead = DeadLetters(self.publisher, "trainer")
        self.metrics = MetricsReporter(
            self.publisher, "trainer", f"trainer.{self.policy}", settings.region, every_s=cfg.metrics_every_s
        )
        self._announce()
        self.intake = SampleIntake(
            settings, self.policy, self.buffer, self.dead, frozenset(self.recipe.policy_names)
        )
        self.topic = self.intake.topic
        self.lockstep = None
        if cfg.lockstep and len(self.recipe.policies) > 1:
            from trainer.lockstep import PolicyVersions

            self.lockstep = PolicyVersions(settings, self.policy, self.recipe.policy_names)

    def _reconcile_store(self) -> None:
        """Make the store agree with the checkpoint: the current version exists (version 0 at first
        start); versions stored after it are lost (module docstring) and the resumed weights become
        the version after the newest."""
        latest = self.store.latest
        if latest == self.version:
            return
        if latest is None and self.version == 0:
            self.store.publish(self.engine.state_dict(), 0, step=0)
            return
        if latest is None or latest < self.version:
            raise TrainerError(
                f"{self.policy}: the weight store at {self.store.root} lacks version {self.version} "
                "that the checkpoint says was published; restore the store or the run directory"
            )
        self.buffer.lose_versions(self.version, latest)
        log.warning(
            "%s: resumed at version %d but the store holds up to %d: versions %d..%d are lost "
            "(their samples are dropped as stale); publishing the resumed weights as %d",
            self.policy,
            self.version,
            latest,
            self.version + 1,
            latest,
            latest + 1,
        )
        self.version = latest + 1
        self.store.publish(self.engine.state_dict(), self.version, step=self.step)

    def _warm_up(self) -> None:
        """Supervised steps on the environment's demonstrations (`trainer.warmup`), published as the
        next version at step 0 with a checkpoint, so that a restart does not warm up again."""
        from trainer.warmup import read_demonstrations, warm_up

        assert self.cfg.warmup is not None and self.settings is not None
        demos = read_demonstrations(
            self.settings,
            self.policy,
            self.recipe.demonstration_source(self.policy),
            self.cfg.warmup.demonstrations,
            self.dead,
            stopped=lambda: self.stop_requested,
        )
        if demos is None:  # stopped while waiting for them: the next start warms up
            return
        stats = warm_up(
            self.engine.model,
            self.tokenizer,
            demos,
            self.cfg.warmup,
            seed=self.recipe.model_for(self.policy).seed,
        )
        tmp = Path(tempfile.mkdtemp(prefix=f".{WARMED}.", dir=self.home))
        self.engine.model.save_pretrained(tmp)
        self.tokenizer.save_pretrained(tmp)
        shutil.rmtree(self.home / WARMED, ignore_errors=True)  # a warm-up cut short before its checkpoint
        tmp.rename(self.home / WARMED)
        if self.engine.ref_model is not None:
            self.engine.ref_model.load_state_dict(self.engine.model.state_dict())
        (self.home / "warmup.json").write_text(json.dumps(stats, indent=1))
        log.warning(
            "%s: warmed up in %d supervised steps (%.1f s): loss %.3f -> %.3f, demonstrations' reward %.2f",
            self.policy,
            self.cfg.warmup.steps,
            stats["warmup.seconds"],
            stats["warmup.loss_first"],
            stats["warmup.loss_last"],
            stats["warmup.demo_reward"],
        )
        self.warm_pending = False
        self.engine.serving_published = True
        self._publish(checkpoint=True)

    # ------------------------------------------------------------------ loop

    def run(self) -> int:
        """Train until stopped (SIGTERM/SIGINT) or `max_steps`; returns the exit status."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        if self.dist.leader:
            self._setup_leader()
            if self.warm_pending and not self.stop_requested:
                self._warm_up()
        gcpause.settle()
        clean = False
        try:
            while True:
                started = time.monotonic()
                batch = self._next_batch() if self.dist.leader else None
                if batch is None:
                    self.wait_s += time.monotonic() - started
                if distributed.agree_stop(self.dist, self.stop_requested or self._done()):
                    break
                rows = (
                    collate(batch.samples, self.tokenizer.pad_token_id) if batch and batch.samples else None
                )
                totals = (
                    (float(rows.mask.sum()), float((rows.mask.sum(-1) > 0).sum()))
                    if rows is not None
                    else (0.0, 0.0)
                )
                mine, num_tokens, num_seqs, _ = distributed.exchange(self.dist, rows, totals, self.step + 1)
                if mine is not None:
                    self._train(batch, mine, num_tokens, num_seqs)
                elif batch is not None:  # every sample was stale: nothing to train
                    self._finish_batch(batch, {})
                    self._announce()  # no new version, but the feeder must learn these groups are consumed
            clean = True
        finally:
            self._close(clean)
        return 0

    def _on_signal(self, signum: int, _frame: object) -> None:
        log.warning("%s: signal %d, stopping after the current step", self.policy, signum)
        self.stop_requested = True

    def _done(self) -> bool:
        return self.max_steps is not None and self.step >= self.max_steps

    def _next_batch(self) -> Batch | None:
        if self.stop_requested or self._done():
            return None
        if time.monotonic() - self.intake.partition_check > PARTITION_CHECK_S:
            self.intake.grow_partitions()
        if self.lockstep is not None and not self.lockstep.ready(self.version):
            self.intake.poll(0.2)
            return None
        batch = self._take()
        self.intake.poll(0.0 if batch is not None else 0.2)  # never wait for Kafka with a batch in hand
        return batch if batch is not None else self._take()

    def _take(self) -> Batch | None:
        return self.buffer.take(
            self.cfg.batch_groups, self.cfg.batch_tokens, self.version, self.recipe.max_staleness
        )

    def _train(self, batch: Batch | None, rows: Any, num_tokens: float, num_seqs: float) -> None:
        self.step += 1
        stats = self.engine.step(rows, self.step, num_tokens, num_seqs)
        failpoints.hit(failpoints.TRAINER_ENV, "mid_step", self.step, self.home)
        if self.step % self.cfg.publish_every == 0:  # on every rank: the next steps score published weights
            self.engine.serving_published = True
        if batch is not None:  # the leader
            stats["tokens_per_s"] = batch.tokens / max(stats["step_s"], 1e-9)
            self._finish_batch(batch, stats)
            if self.step % self.cfg.publish_every == 0:
                self._publish(checkpoint=self._checkpoint_due())
            elif self._checkpoint_due():
                self._checkpoint()
        elif self.step % self.cfg.publish_every == 0 or self._checkpoint_due():
            self._gather_for_leader()

    def _checkpoint_due(self) -> bool:
        every = self.cfg.checkpoint_every
        return self.step % every == 0 if every else self.step % self.cfg.publish_every == 0

    def _finish_batch(self, batch: Batch, stats: dict[str, float]) -> None:
        self.buffer.done(batch, self.step)
        self.batches += 1
        with open(self.home / "trained.jsonl", "a") as fh:  # the audit ledger (see _truncate_ledger)
            fh.write(
                json.dumps(
                    {
                        "batch": self.batches,
                        "step": self.step,
                        "version": self.version,
                        "trained": bool(stats),
                        "groups": batch.group_ids,
                        "formed": batch.formed_at,
                        "time": time.time(),
                        "samples": len(batch.samples),
                        "stale": len(batch.stale),
                    }
                )
                + "\n"
            )
        lags = Counter(batch.lags)
        # Rewards of everything the batch's groups rolled out (stale samples included: they show the
        # behaviour policy); with a zero-variance filter upstream this over-represents mixed groups.
        rewards = [s.reward for s in (*batch.samples, *batch.stale)]
        if rewards:
            stats["reward.mean"] = sum(rewards) / len(rewards)
            stats["reward.success"] = sum(r >= self.cfg.success_threshold - 1e-9 for r in rewards) / len(
                rewards
            )
        values = {
            **stats,
            "step": self.step,
            "version": self.version,
            "batch.groups": len(batch.groups),
            "batch.samples": len(batch.samples),
            "batch.tokens": batch.tokens,
            "staleness.dropped": len(batch.stale),
            "staleness.mean": sum(batch.lags) / len(batch.lags) if batch.lags else 0.0,
            "deadletter": self.dead.count,
            "wait_s": self.wait_s,
            **{k: float(v) for k, v in self.buffer.counts.items()},
        }
        top = min(self.recipe.max_staleness, STALENESS_BUCKETS - 1)
        values.update({f"staleness.lag.{k}": float(lags.get(k, 0)) for k in range(top + 1)})
        if self.recipe.max_staleness > top:
            values[f"staleness.lag.ge{top + 1}"] = float(sum(n for k, n in lags.items() if k > top))
        values.pop("step_s", None)
        self.metrics.report(values, step=self.step, force=False)

    def _truncate_ledger(self) -> None:
        """Drop ledger lines of batches the checkpoint does not contain (lost in a crash)."""
        path = self.home / "trained.jsonl"
        self.home.mkdir(parents=True, exist_ok=True)
        if path.exists():
            kept = [
                line
                for line in path.read_text().splitlines()
                if line.strip() and json.loads(line)["batch"] <= self.batches
            ]
            path.write_text("".join(line + "\n" for line in kept))

    def _close(self, clean: bool) -> None:
        if self.dist.leader and hasattr(self, "intake"):
            self.publications.join()
            if clean and self.step > self.last_checkpoint:
                self._checkpoint()  # steps since the last publication are kept, not retrained
            self.intake.close()
            if self.lockstep is not None:
                self.lockstep.close()
            self.publisher.flush()
            if self.server is not None:
                self.server.close()
        elif clean and self.step > self.last_checkpoint:  # the leader's final checkpoint, above
            self._gather_for_leader()
        if clean:
            distributed.shutdown(self.dist)
