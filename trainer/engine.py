"""One optimiser step on a batch of Samples: micro-batches, loss, AdamW.

The model holds float32 master weights; an optional autocast runs forward/backward in bfloat16.
A batch is padded into rows, sorted by length and cut into micro-batches of at most
`micro_batch_tokens` padded tokens (trainer/rows.py) whose gradients accumulate; the loss of each
micro-batch is divided by the batch-wide token (or sequence) count, so the sum over micro-batches,
and over data-parallel ranks, is exactly the batch's loss. Under DDP every rank runs its rows and the
gradients are all-reduced once, on the last micro-batch (DDP averages, so the loss is scaled by the
world size to keep the sum). Under FSDP2 (`trainer.parallel: fsdp`, trainer/sharding.py) the same
holds with a reduce-scatter, which also averages. The learning rate follows a linear warm-up, set
explicitly each step so that nothing but the step number needs checkpointing.

M2PO's mask is a property of the whole batch (the largest squared log-ratios of all its tokens),
so it cannot be decided inside one micro-batch: with `policy_loss: m2po` a step first runs a
no-grad forward over every micro-batch to get log pi_old - log mu (pi_old: the weights before
this step), gathers the squared log-ratios of every rank, cuts them once (`m2po_cut`), and only
then runs the gradient passes, each with its share of the one mask. The cost is one extra forward
per step; the mask no longer depends on how the batch was split into micro-batches or ranks.

Log-probs are those of the workers' sampling distribution (`sampling`, from the recipe's `worker`
section, through the same function the torch engine samples with), so on-policy the importance
ratio is 1. With top-p or top-k a trained token may lie outside the *current* policy's kept set
(it was inside the behaviour policy's): its log-prob is -inf, so it is masked out of the loss (no
gradient, as for a clipped token) and counted as `outside_support`, the fraction of loss tokens.

The workers sample with the *published* weights, rounded to `weights_dtype`; scoring with the float32
master weights instead would make every on-policy ratio differ from 1 by the rounding (~1e-3 in
bfloat16). So with `score_published_weights` the step rounds the master weights in place, runs every
micro-batch there, restores them and lets the optimiser apply that gradient to the float32 weights.
Only once the workers run published weights (`serving_published`, set by the service from version 1
on): at version 0 they run the initial checkpoint as stored, unrounded.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.nn.parallel import DistributedDataParallel

from astraflow.config.trainer import TrainerConfig
from astraflow.errors import AstraFlowError
from astraflow.sampling import SamplingSettings
from trainer import sharding
from trainer.losses import LossSettings, log_ratio, m2po_cut, policy_loss, token_logprobs
from trainer.prefix import MASKABLE, Packing, packed_logits, plan_packing
from trainer.rows import Rows, _logits, micro_batches

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule  # what fully_shard makes of the model

#: Sums reduced over micro-batches and ranks (order matters: they travel as one tensor).
STAT_KEYS = (
    "tokens",
    "loss",
    "loss.pg",
    "loss.kl",
    "clipped",
    "is_weight",
    "mismatch.abs",
    "mismatch.kl",
    "kl_ref",
    "entropy",
    "outside",
    "positions",
    "positions.run",
)


def loss_settings(cfg: TrainerConfig) -> LossSettings:
    loss = cfg.loss
    return LossSettings(
        clip_low=loss.clip_low,
        clip_high=loss.clip_high,
        dual_clip=loss.dual_clip,
        tis_cap=loss.tis_cap,
        aggregation=loss.aggregation,
        kl_coef=loss.kl_coef,
        entropy_coef=loss.entropy_coef,
        policy_loss=loss.policy_loss,
        log_ratio_clamp=loss.log_ratio_clamp,
        m2_threshold=loss.m2_threshold,
        norm_length=loss.norm_length,
        kl_estimator=loss.kl_estimator,
        kl_in=loss.kl_in,
    )


def make_optimizer(
    params: list[torch.nn.Parameter], cfg: TrainerConfig, sharded: bool = False
) -> torch.optim.AdamW:
    """AdamW as `cfg` says, fused (each parameter's whole update in one kernel, as TRL's default
    `adamw_torch_fused`) where torch fuses it: the arithmetic recipe's CPU step 42.5 -> 39.5 ms, the
    per-parameter loop having dispatched ~8 small ops per tensor. FSDP's sharded (DTensor)
    parameters take the multi-tensor `foreach` form instead. The same update either way, up to
    the rounding of the operations' order."""
    fusable = not sharded and all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    kwargs: dict[str, Any] = {
        "lr": cfg.lr,
        "betas": cfg.betas,
        "eps": cfg.eps,
        "weight_decay": cfg.weight_decay,
        "fused" if fusable else "foreach": True,
    }
    return torch.optim.AdamW(params, **kwargs)


class TrainEngine:
    """Model, optional frozen reference, AdamW, and the step."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: TrainerConfig,
        device: torch.device,
        ref_model: torch.nn.Module | None = None,
        distributed: bool = False,
        pad_id: int = 0,
        sampling: SamplingSettings | None = None,
    ) -> None:
        self.cfg = cfg
        #: the behaviour distribution's settings: pass SamplingSettings.of(recipe.worker)
        self.sampling = sampling or SamplingSettings()
        self.pad_id = pad_id
        self.device = device
        self.model = model.to(device=device, dtype=torch.float32)
        self.ref_model = ref_model.to(device).eval().requires_grad_(False) if ref_model is not None else None
        self.distributed = distributed
        self.world = torch.distributed.get_world_size() if distributed else 1
        self.wrapped: torch.nn.Module = self.model
        #: FSDP2: parameters and optimiser state are sharded across the ranks (trainer/sharding.py)
        self.sharded = distributed and cfg.parallel == "fsdp"
        #: under FSDP, rank 0's copy of the full weights as loaded, published as version 0 by
        #: `state_dict()` before the first step (only rank 0 publishes, so it cannot gather then)
        self._initial_state: dict[str, torch.Tensor] | None = None
        self._steps = 0
        if self.sharded:
            if torch.distributed.get_rank() == 0:
                self._initial_state = {
                    k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()
                }
            sharding.shard(self.model)  # in place: the model is its own wrapper
        elif distributed:
            self.wrapped = DistributedDataParallel(
                self.model, device_ids=[device.index] if device.type == "cuda" else None
            )
        self.optimizer = make_optimizer(list(self.model.parameters()), cfg, sharded=self.sharded)
        config = getattr(self.model, "config", None)
        attention = getattr(config, "_attn_implementation", None)
        #: pack rows that share a prefix into one (trainer/prefix.py), where the attention takes a 4-D mask
        self.shared_prefix = cfg.shared_prefix and attention in MASKABLE
        self._additive_mask = attention == "eager"
        self._hidden_size = int(getattr(config, "hidden_size", 1024))
        self.settings = loss_settings(cfg)
        #: the workers run weights published in cfg.weights_dtype (True from version 1 on; the service
        #: sets it on every rank at the same step)
        self.serving_published = False

    def lr_at(self, step: int) -> float:
        """Learning rate of 1-based step `step`: linear warm-up, then the configured decay."""
        cfg, warm = self.cfg, self.cfg.warmup_steps
        if warm and step < warm:
            return cfg.lr * step / warm
        if cfg.lr_decay == "none" or cfg.decay_steps is None:
            return cfg.lr
        t = min(1.0, (step - warm) / (cfg.decay_steps - warm))
        left = 1.0 - t if cfg.lr_decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * t))
        return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * left)

    def entropy_coef_at(self, step: int) -> float:
        """Entropy-bonus weight of 1-based step `step`: with entropy_target the adaptive weight (kept in
        the optimiser's param group, so checkpoints carry it), else entropy_coef, decayed linearly to
        0 after entropy_decay_steps steps if set."""
        loss = self.cfg.loss
        if loss.entropy_target is not None:
            return float(self.optimizer.param_groups[0].get("entropy_coef", loss.entropy_coef))
        if loss.entropy_decay_steps is None:
            return loss.entropy_coef
        return loss.entropy_coef * max(0.0, 1.0 - (step - 1) / loss.entropy_decay_steps)

    def _autocast(self) -> contextlib.AbstractContextManager[object]:
        if self.cfg.autocast == "bfloat16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _packing(self, rows: Rows) -> Packing | None:
        if not self.shared_prefix:
            return None
        return plan_packing(rows.tokens, rows.lengths, rows.mask, self.pad_id, self._hidden_size)

    def _forward(self, model: torch.nn.Module, rows: Rows, packing: Packing | None) -> torch.Tensor:
        """Logits [N, L, V] of `rows`: one forward over the rows, or over their packing."""
        with self._autocast():
            if packing is None:
                return _logits(model, rows.tokens.to(self.device))
            return packed_logits(model, packing, self.device, self._additive_mask)

    @contextlib.contextmanager
    def _published_weights(self) -> Iterator[None]:
        """Inside: the parameters hold the values the workers run (rounded to weights_dtype)."""
        if (
            not (self.serving_published and self.cfg.score_published_weights)
            or self.cfg.weights_dtype == "float32"
        ):
            yield
            return
        dtype = getattr(torch, self.cfg.weights_dtype)
        params = list(self.model.parameters())
        master = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p in params:
                p.copy_(p.to(dtype))
        try:
            yield
        finally:
            with torch.no_grad():
                for p, m in zip(params, master, strict=True):
                    p.copy_(m)

    def step(self, rows: Rows, step: int, num_tokens: float, num_seqs: float) -> dict[str, float]:
        """Forward, backward and optimiser step on this rank's `rows` of a batch with `num_tokens`
        loss tokens and `num_seqs` sequences in all. Returns batch-wide metrics."""
        start = time.perf_counter()
        self.wrapped.train()
        self.optimizer.zero_grad(set_to_none=True)
        lr = self.lr_at(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        settings = replace(self.settings, entropy_coef=self.entropy_coef_at(step))
        if not len(rows):  # a rank without rows still joins the gradient all-reduce, with zeros
            rows = Rows.filler(self.pad_id)
        parts = micro_batches(rows, self.cfg.micro_batch_tokens)
        if self.sharded:  # every pass all-gathers: every rank must run as many
            count = torch.tensor([len(parts)])
            torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
            parts += [Rows.filler(self.pad_id) for _ in range(int(count) - len(parts))]
        keeps: list[torch.Tensor | None] = [None] * len(parts)
        packings = [self._packing(mb) for mb in parts]
        m2po: dict[str, float] = {}
        sums = dict.fromkeys(STAT_KEYS, 0.0)
        with self._published_weights():
            if settings.policy_loss == "m2po":  # cut on the weights the gradient passes score with
                masks, m2po = self.m2po_masks(parts, settings, packings)
                keeps = list(masks)
            for i, mb in enumerate(parts):
                sync = i == len(parts) - 1
                no_sync: Any = contextlib.nullcontext()
                if self.sharded:  # FSDP2: keep unsharded gradients locally, reduce-scatter on the last
                    cast("FSDPModule", self.model).set_requires_gradient_sync(sync)
                elif self.distributed and not sync:  # accumulate locally; all-reduce on the last micro-batch
                    no_sync = cast(DistributedDataParallel, self.wrapped).no_sync()
                with no_sync:
                    part = self._micro_step(mb, packings[i], settings, num_tokens, num_seqs, keeps[i])
                    for k, v in part.items():
                        sums[k] += v
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = sharding.full_tensor(
            torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm or float("inf"))
        )
        self.optimizer.step()
        self._steps += 1
        self._initial_state = None
        stats = torch.tensor([sums[k] for k in STAT_KEYS], dtype=torch.float64)
        if self.distributed:
            torch.distributed.all_reduce(stats)
        total = dict(zip(STAT_KEYS, stats.tolist(), strict=True))
        tokens = max(total["tokens"], 1.0)
        elapsed = time.perf_counter() - start
        out = {
            "loss": total["loss"],
            "loss.pg": total["loss.pg"],
            "clip_fraction": total["clipped"] / tokens,
            "entropy": total["entropy"] / tokens,
            "mismatch.abs": total["mismatch.abs"] / tokens,
            "mismatch.kl": total["mismatch.kl"] / tokens,
            "is_weight.mean": total["is_weight"] / tokens,
            "grad_norm": float(norm),
            "lr": lr,
            "entropy_coef": settings.entropy_coef,
            "loss_tokens": total["tokens"],
            "step_s": elapsed,
            "outside_support": total["outside"] / max(total["tokens"] + total["outside"], 1.0),
            # the share of the rows' padded positions the forward did not run (trainer/prefix.py)
            "positions_saved": 1.0 - total["positions.run"] / max(total["positions"], 1.0),
        }
        target = self.cfg.loss.entropy_target
        if target is not None and total["tokens"] > 0:  # every rank holds the same batch-wide entropy
            coef = max(
                0.0, settings.entropy_coef + self.cfg.loss.entropy_adapt_rate * (target - out["entropy"])
            )
            for group in self.optimizer.param_groups:
                group["entropy_coef"] = coef
        if self.ref_model is not None:
            out["kl_ref"] = total["kl_ref"] / tokens
            out["loss.kl"] = total["loss.kl"]
        return out | m2po

    def m2po_masks(
        self, parts: list[Rows], settings: LossSettings, packings: list[Packing | None] | None = None
    ) -> tuple[list[torch.Tensor], dict[str, float]]:
        """M2PO's keep-mask of each micro-batch, cut on the squared log-ratios of the whole batch
        (every micro-batch of every rank), and its batch-wide metrics: `m2po.m2` (the second moment
        before masking), `m2po.m2_kept` (after) and `m2po.masked_fraction`."""
        squares, local = [], []
        with torch.no_grad():
            for mb, packing in zip(parts, packings or [self._packing(mb) for mb in parts], strict=True):
                tokens = mb.tokens.to(self.device)
                logits = self._forward(self.model, mb, packing)
                logp = token_logprobs(logits, tokens, self.sampling, with_entropy=False)[0]
                sq = log_ratio(logp, mb.behaviour.to(self.device), settings.log_ratio_clamp) ** 2
                squares.append(sq)
                local.append(sq[mb.mask.to(self.device).bool()])
        values = self._gather(torch.cat(local))
        cut = m2po_cut(values, settings.m2_threshold)
        keeps = [mb.mask.to(self.device).bool() & (sq < cut) for mb, sq in zip(parts, squares, strict=True)]
        kept = values[values < cut].double()
        n = max(values.numel(), 1)
        return keeps, {
            "m2po.m2": float(values.double().sum()) / n,
            "m2po.m2_kept": float(kept.mean()) if kept.numel() else 0.0,
            "m2po.masked_fraction": 1.0 - kept.numel() / n if values.numel() else 0.0,
        }

    def _gather(self, local: torch.Tensor) -> torch.Tensor:
        """The 1-D tensors of every rank, concatenated (ranks may hold different counts)."""
        if not self.distributed:
            return local
        dist = torch.distributed
        count = torch.tensor([local.numel()], device=local.device)
        counts = [torch.zeros_like(count) for _ in range(self.world)]
        dist.all_gather(counts, count)
        longest = max(max(int(c) for c in counts), 1)  # no rank may send an empty tensor
        padded = torch.zeros(longest, dtype=local.dtype, device=local.device)
        padded[: local.numel()] = local
        pieces = [torch.zeros_like(padded) for _ in range(self.world)]
        dist.all_gather(pieces, padded)
        return torch.cat([p[: int(c)] for p, c in zip(pieces, counts, strict=True)])

    def _micro_step(
        self,
        mb: Rows,
        packing: Packing | None,
        settings: LossSettings,
        num_tokens: float,
        num_seqs: float,
        m2po_keep: torch.Tensor | None = None,
    ) -> dict[str, float]:
        tokens = mb.tokens.to(self.device)
        logits = self._forward(self.wrapped, mb, packing)
        logp, entropy = token_logprobs(logits, tokens, self.sampling, entropy_grad=settings.entropy_coef > 0)
        mask = mb.mask.to(self.device)
        # a token outside the current policy's top-p/top-k set has log-prob -inf and no gradient:
        # out of the loss; the 0 written in its place (padding included) keeps 0 * inf out of the sums
        dropped = torch.isinf(logp)
        outside = dropped & (mask > 0)
        if bool(dropped.any()):
            mask = mask.masked_fill(outside, 0.0)
            logp = logp.masked_fill(dropped, 0.0)
        ref_logp = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref_logits = self._forward(self.ref_model, mb, packing)
            ref_logp = token_logprobs(ref_logits, tokens, self.sampling, with_entropy=False)[0]
        loss, stats = policy_loss(
            logp,
            mb.behaviour.to(self.device),
            mb.advantages.to(self.device),
            mask,
            settings,
            entropy=entropy,
            ref_logp=ref_logp,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            m2po_keep=m2po_keep,
        )
        (loss * self.world).backward()
        stats["outside"] = float(outside.sum())
        stats["positions"] = float(tokens.numel())
        stats["positions.run"] = float(packing.positions_run if packing else tokens.numel())
        return {k: v for k, v in stats.items() if k in STAT_KEYS}

    @torch.no_grad()
    def logprobs(self, rows: Rows) -> torch.Tensor:
        """Log-probs [N, L-1] of `rows`' tokens under the current weights, exactly as a step
        computes them (same forward, same sampling distribution); -inf outside top-p/top-k."""
        tokens = rows.tokens.to(self.device)
        self.model.eval()
        with self._published_weights():
            logits = self._forward(self.model, rows, self._packing(rows))
        return token_logprobs(logits, tokens, self.sampling, with_entropy=False)[0]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The float32 master weights (what gets published, cast to the weights dtype). Under FSDP
        only rank 0's weights as loaded, before the first step: later ones need `full_state()`."""
        if not self.sharded:
            return self.model.state_dict()
        if self._initial_state is None:
            raise AstraFlowError(
                "under FSDP the weights after a step are gathered by TrainEngine.full_state() "
                "on every rank; state_dict() only gives rank 0 the weights as loaded"
            )
        return self._initial_state

    def full_state(self) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any] | None]:
        """(model state dict, index-keyed optimiser state dict) for publication and checkpoints:
        live references without FSDP; under FSDP gathered on rank 0 (CPU copies), None on the
        other ranks, and a collective that every rank must call at the same point."""
        if not self.sharded:
            return self.model.state_dict(), self.optimizer.state_dict()
        return sharding.full_model_state(self.model), sharding.full_optimizer_state(
            self.model, self.optimizer
        )

    def load_optimizer(self, state: dict[str, Any]) -> None:
        """Restore an index-keyed optimiser state dict (from a DDP or an FSDP checkpoint alike)."""
        if self.sharded:
            sharding.load_full_optimizer_state(self.model, self.optimizer, state)
        else:
            self.optimizer.load_state_dict(state)
