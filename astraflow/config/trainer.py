"""Config of the trainer (`astraflow trainer --policy P`). Owned by the trainer component.

One section, `trainer:`, applies to every policy's trainer of a recipe; a policy may change keys of
its own trainer (`policies[].trainer`, e.g. its learning rate) and of its loss (`policies[].loss`),
`Recipe.trainer_for`. The loss is
algorithm-blind (advantages come on the Samples); what it exposes is the choice of surrogate
(PPO, GSPO, CISPO, M2PO), its clipping and importance-sampling correction, the aggregation and the
regularisers.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from astraflow.config.base import StrictModel


class LossConfig(StrictModel):
    """The policy-gradient loss (see trainer/losses.py for the maths of each option). Log-probs are
    those of the workers' sampling distribution (`worker.temperature`, `top_p`, `top_k`): there is no
    loss temperature."""

    policy_loss: Literal["ppo", "gspo", "cispo", "m2po"] = "ppo"
    """Surrogate: `ppo`, clipped token ratio pi/mu (with optional dual clip, or truncated IS as
    decoupled PPO); `gspo`, one ratio per sequence (the geometric mean of its token ratios), clipped
    per sequence; `cispo`, every token keeps its gradient, weighted by the detached ratio clipped to
    [1 - clip_low, 1 + clip_high]; `m2po`, no clip: the tokens of the batch with the largest squared
    log-ratio are masked until the mean of the rest is at most m2_threshold."""
    clip_low: float = Field(default=0.2, ge=0, lt=1)
    """Lower clip of the importance ratio: 1 - clip_low (ppo, gspo; cispo's weight)."""
    clip_high: float = Field(default=0.28, ge=0)
    """Upper clip of the importance ratio: 1 + clip_high (DAPO's clip-higher when > clip_low)."""
    dual_clip: float | None = Field(default=None, gt=1)
    """Dual clip constant c > 1: the loss of a negative-advantage token is at most -c * A (ppo only)."""
    tis_cap: float | None = Field(default=None, gt=0)
    """Truncated importance sampling: take the ratio against the current policy and weight each
    token by min(pi / mu, tis_cap) instead of clipping against the behaviour policy mu (ppo only)."""
    log_ratio_clamp: float = Field(default=20.0, gt=0, le=80)
    """log(pi / mu) (and log(pi / ref)) is clamped to +-this before exp: above ~88 exp overflows and
    the gradient becomes inf or NaN. Tokens past the clamp get no gradient through their ratio."""
    m2_threshold: float = Field(default=0.04, gt=0)
    """M2PO's tau: the largest mean squared log-ratio (second moment) left in the loss."""
    aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "constant"] = "token-mean"
    """How per-token losses become one number: `token-mean`, mean over all loss tokens of the batch;
    `seq-mean-token-mean`, mean of per-sequence means; `seq-mean-token-sum`, mean of per-sequence
    sums; `constant`, Dr. GRPO's sum / (sequences x norm_length). The old names `token` and
    `sequence` are read as `token-mean` and `seq-mean-token-mean`."""
    norm_length: int | None = Field(default=None, ge=1)
    """Dr. GRPO's constant length (e.g. the generation budget), required by `aggregation: constant`."""
    kl_coef: float = Field(default=0.0, ge=0)
    """Weight of the KL to the frozen reference (the version-0 weights); 0 = no reference model."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Estimator of KL(pi || ref) per token, d = log pi - log ref: `k1` = d (its gradient as a loss
    is zero in expectation: use it with kl_in: reward); `k2` = d^2 / 2 (as a loss, the gradient of
    KL(pi || ref)); `k3` = exp(-d) + d - 1 (as a loss, the gradient of KL(ref || pi))."""
    kl_in: Literal["loss", "reward"] = "loss"
    """`loss`: add kl_coef * mean KL estimate to the loss; `reward`: subtract kl_coef * the
    (detached) per-token estimate from each token's advantage instead."""
    entropy_coef: float = Field(default=0.0, ge=0)
    """Weight of an entropy bonus (entropy is always reported)."""
    entropy_decay_steps: int | None = Field(default=None, ge=1)
    """Decay the entropy bonus linearly from entropy_coef at step 1 to 0 after this many steps:
    exploration early, no push away from a converged policy late."""
    entropy_target: float | None = Field(default=None, gt=0)
    """Entropy control: the bonus's weight follows the policy's entropy (nats per trained token) to
    keep it near this. After each step the weight changes by entropy_adapt_rate x (target - entropy),
    never below 0, starting from entropy_coef: a policy above the target gets no bonus, one falling
    below gets more and more, so it never turns fully deterministic (a game it loses in every try of
    a group would give it no gradient again). Not with entropy_decay_steps."""
    entropy_adapt_rate: float = Field(default=0.01, gt=0)
    """How fast the entropy bonus's weight follows entropy_target (weight per nat of gap per step)."""

    @model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "temperature" in data:
            raise ValueError(
                "trainer.loss.temperature was removed: the trainer now takes its sampling settings "
                "(temperature, top_p, top_k) from the recipe's worker section; set worker.temperature "
                "and delete trainer.loss.temperature"
            )
        return data

    @field_validator("aggregation", mode="before")
    @classmethod
    def _old_aggregation_names(cls, value: object) -> object:
        if isinstance(value, str):
            return {"token": "token-mean", "sequence": "seq-mean-token-mean"}.get(value, value)
        return value

    @model_validator(mode="after")
    def _options_fit_the_loss(self) -> LossConfig:
        if self.aggregation == "constant" and self.norm_length is None:
            raise ValueError("aggregation: constant needs norm_length (Dr. GRPO's constant length)")
        if self.entropy_target is not None and self.entropy_decay_steps is not None:
            raise ValueError(
                "entropy_target (an adaptive entropy bonus) and entropy_decay_steps (a schedule) "
                "both set the bonus's weight: set one"
            )
        if self.policy_loss != "ppo":
            for key in ("dual_clip", "tis_cap"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key} applies to policy_loss: ppo only, not {self.policy_loss}")
        return self


class WarmupConfig(StrictModel):
    """A cold start: supervised steps on the environment's scripted demonstrations before RL, as RL
    on LLMs starts from a fine-tuned model, for a task an untrained policy never succeeds at (a
    reward that is always 0 gives GRPO no gradient). The demonstrations are episodes the
    environment's `expert` plays through the environment itself, on tasks of another seed than the
    feeder's: the feeder that starts a run writes them to `demonstrations.<policy>`, the trainer
    reads them (`trainer/warmup.py`); the loss is the mean negative log-likelihood of the expert's
    tokens. The warmed weights are published as version 1 at step 0 (version 0 stays the initial
    weights every component builds alike) and are the reference of `loss.kl_coef`."""

    steps: int = Field(ge=1)
    """Supervised steps (AdamW, its own optimiser state)."""
    lr: float = Field(default=1e-3, gt=0)
    """Learning rate of the supervised steps."""
    batch_size: int = Field(default=32, ge=1)
    """Demonstrations per supervised step."""
    demonstrations: int = Field(default=2048, ge=1)
    """Distinct demonstrations played (each step draws batch_size of them)."""


class TrainerConfig(StrictModel):
    """Optimisation, batching, checkpoints and weight publication of one policy's trainer."""

    lr: float = Field(default=1e-4, gt=0)
    """AdamW peak learning rate."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = Field(default=1e-8, gt=0)
    """AdamW epsilon."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW decoupled weight decay."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear learning-rate warm-up from lr/warmup_steps to lr over this many steps."""
    lr_decay: Literal["none", "linear", "cosine"] = "none"
    """After warm-up, decay the learning rate to lr * min_lr_ratio at step `decay_steps`."""
    decay_steps: int | None = Field(default=None, ge=1)
    """Step at which the decay ends (required with lr_decay; later steps keep the final rate)."""
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    """Final learning rate of the decay, as a fraction of lr."""
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    """Clip the global gradient norm to this (None: no clipping; the norm is reported anyway)."""
    batch_groups: int = Field(default=8, ge=1)
    """Groups per optimiser step (a batch closes when it has this many complete groups)."""
    batch_tokens: int | None = Field(default=None, ge=1)
    """Token budget per step: a batch also closes when the next group would exceed it (a batch
    always holds at least one group)."""
    order: Literal["fifo", "edf"] = "fifo"
    """Which complete groups a batch takes first: `fifo`, in the order they completed; `edf`,
    earliest deadline first, the deadline of a sample being its oldest version + max_staleness,
    so the samples closest to going stale train first (groups already wholly stale are dropped
    without taking a place; with workers that queue tasks (worker.max_queued_episodes), FIFO
    dropped 8-10% of arithmetic's samples as stale, EDF 1.4-1.8%). See trainer/batching.py."""
    micro_batch_tokens: int = Field(default=8192, ge=16)
    """Padded tokens per forward/backward pass; larger batches accumulate gradients."""
    shared_prefix: bool = True
    """Run the prompt a group's rows share once per micro-batch instead of once per row, where that
    saves positions (trainer/prefix.py; sdpa and eager attention): the same logits up to float
    rounding. The vs-TRL task's steps ran a third of their 512 padded positions (`positions_saved` 0.66)."""
    publish_every: int = Field(default=1, ge=1)
    """Publish weights (a new version) every this many steps."""
    checkpoint_every: int | None = Field(default=None, ge=1)
    """Checkpoint every this many steps (None: at every publication). Versions are announced
    without waiting for a checkpoint; a trainer resumed from an older checkpoint than its newest
    version publishes after it and drops the samples of the versions in between as stale."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """Checkpoints kept on disk (older ones are deleted)."""
    weights_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """dtype of the published inference weights (the trainer keeps float32 master weights)."""
    score_published_weights: bool = True
    """Run forward and backward on the master weights rounded to weights_dtype, i.e. on the weights
    the workers sample with, and apply the gradient to the float32 master weights (straight
    through). Without it, bfloat16 rounding alone puts the on-policy |log-ratio| near 1e-3; with
    it, ~1e-7 for float32 engines. Costs one extra float32 copy of the parameters."""
    snapshot_every: int = Field(default=10, ge=1)
    """A full snapshot every this many versions; sparse deltas in between."""
    keep_versions: int | None = Field(default=None, ge=2)
    """Versions whose files the store keeps for workers (default: max_staleness + 2)."""
    compress_level: int | None = Field(default=None, ge=0, le=22)
    """zstd level of deltas (0: uncompressed). Level 1 compressed the arithmetic recipe's 0.8 MB deltas
    in 2.1 ms to 0.541 of their size, level 3 in 3.3 ms to 0.531: a publication every step pays it.
    Unset: level 1 where the weights may cross a network (`serve_http`, or a `store_dir`, which may be
    a shared filesystem), none for the run directory's own store, which the machine's workers read
    from the page cache: there zstd saved nothing and cost CPU at every version, and an uncompressed
    delta is at most a snapshot's size (`astraflow.weights.format`). A version of the arithmetic
    recipe's model cost 13.1 ms of the trainer's CPU to publish and 8.0 ms of a worker's to apply
    with zstd-1 and no tensor in full, 7.9-8.3 and 4.1-4.2 ms uncompressed with them."""
    warmup: WarmupConfig | None = None
    """Supervised warm-up before the first RL step (None: RL from the initial weights)."""
    store_dir: str | None = None
    """Weight store root, local or on a shared filesystem (default: <run dir>/weights)."""
    serve_http: bool = False
    """Serve the weight store over HTTP and advertise http:// URIs (for workers without the shared
    filesystem)."""
    http_host: str = "127.0.0.1"
    """Address the weight server binds."""
    http_port: int = Field(default=0, ge=0, le=65535)
    """Port of the weight server, one per policy (0: any free port; a fixed port keeps the URIs of
    events announced before a restart valid after it, though the restarted trainer re-announces
    its current version with the new URIs anyway)."""
    advertise_host: str | None = None
    """Host name put in the advertised URIs (default: http_host)."""
    lockstep: bool = False
    """Do not start a step towards version n+1 before every other policy has published version n."""
    loss: LossConfig = LossConfig()
    """The policy-gradient loss."""
    device: str = "auto"
    """Torch device: `auto` (CUDA when available, else CPU), `cpu`, `cuda`, `cuda:1`, ..."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """Data parallelism under torchrun (ignored in one process): `ddp`, every rank holds the whole
    model and optimiser and gradients are all-reduced; `fsdp`, FSDP2 `fully_shard` per decoder
    layer, so each rank holds 1/world of the parameters, gradients and AdamW moments (models that
    do not fit one device). Losses are the same; published weights and checkpoints are the full
    state gathered on rank 0, in the same layout either way."""
    autocast: Literal["none", "bfloat16"] = "none"
    """Mixed precision for forward/backward (master weights stay float32)."""
    dedupe_window: int = Field(default=100_000, ge=1)
    """Trained group ids remembered to drop duplicates (the oldest are forgotten first)."""
    max_steps: int | None = Field(default=None, ge=1)
    """Stop after this many steps (None: run until stopped)."""
    metrics_every_s: float = Field(default=0.0, ge=0)
    """Publish step metrics at most this often (0: every step)."""
    success_threshold: float = 1.0
    """A sample counts as a success (metric `reward.success`) when its reward is at least this."""

    @model_validator(mode="after")
    def _decay_needs_steps(self) -> TrainerConfig:
        if self.lr_decay != "none" and self.decay_steps is None:
            raise ValueError(f"decay_steps is required with lr_decay: {self.lr_decay}")
        if self.decay_steps is not None and self.decay_steps <= self.warmup_steps:
            raise ValueError(
                f"decay_steps ({self.decay_steps}) must be after warmup_steps ({self.warmup_steps})"
            )
        return self

    def delta_compress_level(self) -> int:
        """The zstd level deltas are written at: `compress_level`, or 1 where they may cross a network."""
        if self.compress_level is not None:
            return self.compress_level
        return 1 if self.serve_http or self.store_dir else 0

    def store_versions(self, max_staleness: int) -> int:
        return self.keep_versions or max_staleness + 2
