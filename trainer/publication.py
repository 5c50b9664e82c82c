"""The trainer's publication and checkpoint writing, mixed into `trainer.service.Trainer`.

Every `publish_every` steps the leader copies the step's weights and buffer state (and the
optimiser's, for a checkpoint) at once, then, in the background while the next step trains
(`Trainer.publications`), stores the new version in the weight store, checkpoints it when due
(before announcing it: a version checkpointed with its publication is never lost) and announces
the WeightVersion event on `weights`. Under FSDP every rank takes part in gathering the full state.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from pathlib import Path
from typing import Any

from astraflow import failpoints
from astraflow.config.trainer import TrainerConfig
from astraflow.kafka import Publisher
from astraflow.records import WeightVersion
from astraflow.weights import WeightStore
from astraflow.weights.auth import sign
from trainer import checkpoint as ckpt
from trainer.background import BackgroundJob
from trainer.batching import GroupBuffer
from trainer.engine import TrainEngine
from trainer.intake import SampleIntake

log = logging.getLogger("trainer.service")  # the Trainer's log: these are its methods


class Publication:
    """Publication and checkpoints of `Trainer` (trainer/service.py), which sets this state."""

    policy: str
    cfg: TrainerConfig
    home: Path
    step: int
    version: int
    batches: int
    last_checkpoint: int
    topic: str
    tokenizer: Any
    buffer: GroupBuffer
    engine: TrainEngine
    publications: BackgroundJob
    store: WeightStore
    publisher: Publisher
    intake: SampleIntake

    def _publish(self, checkpoint: bool) -> None:
        """Make the step's weights version `version + 1`: copy weights and buffer state (and the
        optimiser's, for a checkpoint) now, then write the version, announce it and write the
        checkpoint in the background while the next step trains."""
        self.version += 1
        snap, version = self._snapshot(self.version, optimizer=checkpoint), self.version
        self.publications.submit(lambda: self._write_version(snap, version, checkpoint))

    def _write_version(self, snap: ckpt.Snapshot, version: int, checkpoint: bool) -> None:
        """Store the version, then checkpoint it when due (before announcing: a version checkpointed
        with its publication is never lost), then announce it."""
        event = self.store.publish(snap.model_state, version, step=snap.step)
        failpoints.hit(failpoints.TRAINER_ENV, "mid_publication", snap.step, self.home)
        if checkpoint:
            self._write_checkpoint(snap)
        self.publisher.send("weights", sign(self._progress(event, snap)), key=self.policy)
        self.publisher.flush()
        log.info("%s: published version %d at step %d", self.policy, version, snap.step)

    def _announce(self) -> None:
        self.publications.join()  # the store must hold the current version before it is announced again
        self.publisher.send("weights", sign(self._progress(self.store.event(self.version))), key=self.policy)
        self.publisher.flush()

    def _progress(self, event: WeightVersion, snap: ckpt.Snapshot | None = None) -> WeightVersion:
        """The event with how many groups this trainer has consumed (the feeder's admission control)."""
        counts = snap.state["buffer"]["counts"] if snap is not None else self.buffer.counts
        return dataclasses.replace(event, groups_consumed=counts.get("groups.trained", 0))

    def _snapshot(self, version: int, optimizer: bool = True) -> ckpt.Snapshot:
        """The state to publish (`optimizer=False`: the weights and the buffer's counts, which the
        announcement carries) or to checkpoint (everything: the buffer's offsets and its list of
        trained groups too, which grows with the run; copying it at every step cost 3% of the
        trainer's CPU by step 400)."""
        buffer = self.buffer.state() if optimizer else {"counts": dict(self.buffer.counts)}
        state: dict[str, Any] = {
            "policy": self.policy,
            "version": version,
            "batches": self.batches,
            "time": time.time(),
            "host": socket.gethostname(),
            "topic": self.topic,
            "buffer": buffer,
        }
        model_state, optimizer_state = self.engine.full_state()
        return ckpt.snapshot(self.step, model_state, optimizer_state if optimizer else None, state)

    def _gather_for_leader(self) -> None:
        """Other ranks under FSDP: take part in gathering the full state the leader checkpoints."""
        if self.engine.sharded:
            self.engine.full_state()
        self.last_checkpoint = self.step

    def _checkpoint(self) -> None:
        """A checkpoint of the current version, written now (between publications and at the end)."""
        self.publications.join()
        self._write_checkpoint(self._snapshot(self.version))

    def _write_checkpoint(self, snap: ckpt.Snapshot) -> None:
        self.publisher.flush()  # the dead letters of offsets this checkpoint records are acknowledged
        ckpt.save_checkpoint(
            self.home / "checkpoints",
            snap,
            self.engine.model,
            self.tokenizer,
            keep=self.cfg.keep_checkpoints,
            before_rename=lambda: failpoints.hit(
                failpoints.TRAINER_ENV, "mid_checkpoint", snap.step, self.home
            ),
        )
        self.last_checkpoint = snap.step
        self.intake.uncommitted = snap.state["buffer"]["offsets"]  # the trainer's thread commits them
