"""A recipe: one YAML file that configures every component of a run.

Keys equal field names; an unknown key anywhere is an error naming the key and the file.
Each component reads its own section plus the shared ones (`policies`, `kafka`, `model`,
`max_staleness`).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from astraflow.config.base import StrictModel, format_validation_error, load_model
from astraflow.config.feeder import FeederConfig
from astraflow.config.kafka import KafkaSettings
from astraflow.config.models import ModelSpec
from astraflow.config.run import RunConfig
from astraflow.config.streams import StreamsConfig
from astraflow.config.trainer import LossConfig, TrainerConfig
from astraflow.config.worker import WorkerConfig

POLICY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{0,63}$")
#: `trainer` keys that other components read for every policy at once (`Recipe.staleness_window`,
#: the feeder's progress, the ledger): one policy may not change them.
SHARED_TRAINER_KEYS = frozenset({"batch_groups", "batch_tokens", "publish_every", "max_steps"})


class PolicySpec(StrictModel):
    """A policy trained by this recipe: its name and, optionally, its own model."""

    name: str
    """Policy name; used in topic names (`samples.<name>`) and in trajectories."""
    model: ModelSpec | None = None
    """This policy's model; defaults to the recipe's `model`."""
    loss: dict[str, Any] = Field(default_factory=dict)
    """This policy's trainer's changes to `trainer.loss`, key by key (e.g. `{entropy_target: 0.5}`
    for one policy of two); the rest of `trainer.loss` and of `trainer` apply as they are."""
    trainer: dict[str, Any] = Field(default_factory=dict)
    """This policy's trainer's changes to the other keys of `trainer`, key by key (e.g. `{lr: 1.0e-4}`
    for a policy that learns a task the other's learning rate makes it collapse on); its loss keys
    go in `loss`."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not POLICY_RE.match(v):
            raise ValueError(f"{v!r} is not a valid policy name (letters, digits, '_' and '-', max 64)")
        return v


class Recipe(StrictModel):
    """Everything one run needs."""

    name: str
    """Name of the recipe; names the run directory."""
    description: str = ""
    """One paragraph on what the recipe trains and what to expect."""
    seed: int = 0
    """Global seed."""
    policies: list[PolicySpec] = Field(default_factory=lambda: [PolicySpec(name="policy")], min_length=1)
    """Policies trained together."""
    model: ModelSpec = ModelSpec()
    """Default model of every policy."""
    max_staleness: int = Field(default=2, ge=0)
    """Largest allowed version lag (trainer version minus oldest generating version)."""
    kafka: KafkaSettings = KafkaSettings()
    """Kafka connection; ASTRAFLOW_* variables override it."""
    feeder: FeederConfig = FeederConfig()
    worker: WorkerConfig = WorkerConfig()
    streams: StreamsConfig = StreamsConfig()
    trainer: TrainerConfig = TrainerConfig()
    run: RunConfig = RunConfig()

    @model_validator(mode="after")
    def _unique_policies(self) -> Recipe:
        names = [p.name for p in self.policies]
        if len(set(names)) != len(names):
            raise ValueError(f"policy names must be unique: {names}")
        return self

    @model_validator(mode="after")
    def _policy_trainers(self) -> Recipe:
        for p in self.policies:
            self.trainer_for(p.name)  # a bad key or value fails here, at load time
        return self

    @model_validator(mode="after")
    def _kl_needs_full_support(self) -> Recipe:
        # the trainer reads worker.top_p/top_k too: under truncation a sampled token can lie outside
        # the reference's kept set, where its log-prob is -inf and the KL to the reference infinite
        w = self.worker
        kl = max(self.trainer_for(p).loss.kl_coef for p in self.policy_names)
        if kl > 0 and (w.top_p < 1.0 or w.top_k > 0):
            raise ValueError(
                f"trainer.loss.kl_coef > 0 needs worker.top_p: 1 and worker.top_k: 0 (got {w.top_p}, "
                f"{w.top_k}): the KL to the reference is infinite on tokens outside its top-p/top-k set"
            )
        return self

    @model_validator(mode="after")
    def _groups_fit_the_workers(self) -> Recipe:
        if self.feeder.group_size > self.worker.max_group_size:
            raise ValueError(
                f"feeder.group_size {self.feeder.group_size} exceeds worker.max_group_size "
                f"{self.worker.max_group_size}: the workers would dead-letter every task"
            )
        return self

    @model_validator(mode="after")
    def _window_feeds_the_trainer(self) -> Recipe:
        ahead = self.feeder.ahead_groups
        if ahead is not None and ahead < self.trainer.batch_groups:
            raise ValueError(
                f"feeder.ahead_groups {ahead} is below trainer.batch_groups {self.trainer.batch_groups}: "
                "the trainer would never get a whole batch"
            )
        return self

    @property
    def staleness_window(self) -> int:
        """Groups that may be ahead of the slowest trainer before the next would train stale."""
        t = self.trainer
        return (self.max_staleness + 1) * t.publish_every * t.batch_groups

    @property
    def admission_window(self) -> int:
        """Groups the feeder lets ahead of the slowest trainer: `feeder.ahead_groups`, at most the
        staleness bound's window."""
        return min(self.feeder.ahead_groups or self.staleness_window, self.staleness_window)

    @property
    def run_dir(self) -> Path:
        """The run directory: `run.dir` with {name} replaced by the recipe's name."""
        return Path(self.run.dir.replace("{name}", self.name))

    @property
    def policy_names(self) -> list[str]:
        return [p.name for p in self.policies]

    def trainer_for(self, policy: str) -> TrainerConfig:
        """The `trainer` section as `policy`'s trainer runs it: with the policy's own `trainer` and
        `loss` keys over it."""
        spec = next((p for p in self.policies if p.name == policy), None)
        if spec is None or not (spec.loss or spec.trainer):
            return self.trainer
        data = {**self.trainer.loss.model_dump(), **spec.loss}
        try:
            loss = LossConfig.model_validate(data)
        except ValidationError as exc:
            raise ValueError(format_validation_error(exc, f"policies.{policy}.loss")) from None
        if "loss" in spec.trainer:
            raise ValueError(f"policies.{policy}.trainer: the loss keys go in policies.{policy}.loss")
        if shared := sorted(SHARED_TRAINER_KEYS & spec.trainer.keys()):
            raise ValueError(
                f"policies.{policy}.trainer: {', '.join(shared)} must be the same for every policy (the "
                "feeder's admission window and the run's ledger count groups with them): set it in `trainer`"
            )
        try:
            return TrainerConfig.model_validate({**self.trainer.model_dump(), **spec.trainer, "loss": loss})
        except ValidationError as exc:
            raise ValueError(format_validation_error(exc, f"policies.{policy}.trainer")) from None

    def demonstration_source(self, policy: str) -> str:
        """Names the set of demonstrations of `policy`'s warm-up (`trainer.warmup`): a digest of all
        they are played from (the feeder's environment, its arguments and seed, the workflow, the
        policy's model and tokenizer, how many), computed alike by the feeder that writes them and
        the trainer that reads them, so that a trainer never learns another recipe's."""
        warmup = self.trainer_for(policy).warmup
        what = {
            "env": self.feeder.env,
            "env_args": self.feeder.env_args,
            "seed": self.feeder.seed,
            "workflow": self.worker.workflow,
            "model": self.model_for(policy).model_dump(mode="json"),
            "count": warmup.demonstrations if warmup else 0,
        }
        return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def model_for(self, policy: str) -> ModelSpec:
        for p in self.policies:
            if p.name == policy:
                return p.model or self.model
        from astraflow.errors import ConfigError

        raise ConfigError(f"unknown policy {policy!r}; this recipe has {', '.join(self.policy_names)}")


def load_recipe(path: str | Path) -> Recipe:
    """Load and validate a recipe file. Errors name the file and the key."""
    return load_model(Recipe, path)
