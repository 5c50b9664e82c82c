"""The optimiser step: micro-batches accumulate to the one-pass gradient for every loss and
aggregation, M2PO's mask is batch-wide, the reference KL starts at zero, truncated IS runs end to
end, padding never leaks into the loss, and every surrogate a recipe can name trains without NaN."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from astraflow.config.trainer import LossConfig, TrainerConfig
from tests.trainer.helpers import tiny_model
from tests.trainer.synth import make_group
from trainer.engine import TrainEngine
from trainer.losses import token_logprobs
from trainer.rows import Rows, _logits, collate, micro_batches

CPU = torch.device("cpu")


def rows_of(n_groups: int = 3) -> Rows:
    samples = [s for g in range(n_groups) for s in make_group("p", f"e{g}", seed=g, size=3)]
    return collate(samples, pad_id=0)


def grads_after_step(
    cfg: TrainerConfig, rows: Rows, model: torch.nn.Module
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    engine = TrainEngine(model, cfg, CPU)
    stats = engine.step(rows, 1, float(rows.mask.sum()), float((rows.mask.sum(-1) > 0).sum()))
    return {k: p.grad.clone() for k, p in engine.model.named_parameters()}, stats


@pytest.mark.parametrize(
    "loss",
    [
        LossConfig(aggregation="token"),
        LossConfig(aggregation="sequence"),
        LossConfig(aggregation="seq-mean-token-sum"),
        LossConfig(aggregation="constant", norm_length=16),
        LossConfig(policy_loss="gspo", aggregation="seq-mean-token-mean"),
        LossConfig(policy_loss="cispo"),
        LossConfig(policy_loss="m2po", m2_threshold=1.0),
    ],
    ids=lambda c: f"{c.policy_loss}-{c.aggregation}",
)
def test_micro_batches_accumulate_to_the_one_pass_gradient(loss: LossConfig) -> None:
    rows = rows_of()
    assert len(micro_batches(rows, 40)) > 3  # really split
    model = tiny_model()
    whole, s1 = grads_after_step(
        TrainerConfig(micro_batch_tokens=1 << 16, loss=loss, max_grad_norm=None), rows, copy.deepcopy(model)
    )
    split, s2 = grads_after_step(
        TrainerConfig(micro_batch_tokens=40, loss=loss, max_grad_norm=None), rows, copy.deepcopy(model)
    )
    assert s1["loss"] == pytest.approx(s2["loss"], rel=1e-5) and s1["loss_tokens"] == s2["loss_tokens"]
    for k in whole:
        torch.testing.assert_close(split[k], whole[k], rtol=1e-4, atol=1e-7)
    if loss.policy_loss == "m2po":  # the same tokens masked, part of them
        assert (
            0.05 < s1["m2po.masked_fraction"] < 0.95
            and s1["m2po.masked_fraction"] == s2["m2po.masked_fraction"]
        )
        assert s2["m2po.m2_kept"] <= 1.0 < s2["m2po.m2"]


def test_the_m2po_mask_is_the_same_for_one_or_three_micro_batches() -> None:
    rows = rows_of()
    cfg = TrainerConfig(loss=LossConfig(policy_loss="m2po", m2_threshold=1.0))
    engine = TrainEngine(tiny_model(), cfg, CPU)
    one, three = micro_batches(rows, 1 << 16), micro_batches(rows, 48)
    assert (len(one), len(three)) == (1, 3)

    def by_row(parts: list[Rows]) -> tuple[dict[tuple[int, ...], list[bool]], dict[str, float]]:
        keeps, stats = engine.m2po_masks(parts, engine.settings)
        out = {}
        for mb, keep in zip(parts, keeps, strict=True):
            for tokens, n, k in zip(mb.tokens, mb.lengths, keep, strict=True):
                out[tuple(tokens[:n].tolist())] = k[: n - 1].tolist()
        return out, stats

    (whole, s1), (split, s3) = by_row(one), by_row(three)
    assert whole == split and len(whole) == len(rows)  # row by row, token by token
    assert s3 == pytest.approx(s1, rel=1e-6)  # the log-probs of other batch shapes differ in the last bits
    kept = sum(sum(row) for row in whole.values())
    assert 0 < kept < rows.mask.sum()  # some, not all, of the loss tokens are masked
    assert s1["m2po.masked_fraction"] == pytest.approx(1 - kept / float(rows.mask.sum()))
    # A cut per micro-batch would be another mask. Make micro-batches 2 and 3 on-policy (squares 0):
    # alone, micro-batch 1 must mask most of its tokens; in the batch, the zeros leave more room.
    for mb in three[1:]:
        with torch.no_grad():
            mb.behaviour = token_logprobs(_logits(engine.model, mb.tokens), mb.tokens)[0]
    alone = engine.m2po_masks(three[:1], engine.settings)[0][0]
    in_batch = engine.m2po_masks(three, engine.settings)[0][0]
    assert int(alone.sum()) < int(in_batch.sum())


def test_kl_in_the_reward_leaves_the_loss_and_kl_in_the_loss_adds_to_it() -> None:
    model, rows = tiny_model(), rows_of()
    for kl_in in ("loss", "reward"):
        cfg = TrainerConfig(lr=1e-2, loss=LossConfig(kl_coef=0.5, kl_estimator="k1", kl_in=kl_in))
        engine = TrainEngine(copy.deepcopy(model), cfg, CPU, ref_model=copy.deepcopy(model))
        engine.step(rows, 1, float(rows.mask.sum()), float(len(rows)))
        second = engine.step(rows, 2, float(rows.mask.sum()), float(len(rows)))
        assert abs(second["loss.kl"]) > 1e-5
        want = second["loss.pg"] + (0.5 * second["loss.kl"] if kl_in == "loss" else 0.0)
        assert second["loss"] == pytest.approx(want, rel=1e-6)


def test_padding_and_masked_tokens_do_not_change_the_gradient() -> None:
    rows = rows_of(1)
    model = tiny_model()
    base, _ = grads_after_step(TrainerConfig(max_grad_norm=None), rows, copy.deepcopy(model))
    noisy = copy.deepcopy(rows)
    off = noisy.mask == 0
    noisy.advantages[off] = 123.0  # advantages and behaviour log-probs outside the mask are ignored
    noisy.behaviour[off] = -7.0
    wide = copy.deepcopy(noisy)
    wide.tokens = torch.cat([wide.tokens, torch.full((len(wide), 5), 9)], 1)  # garbage after each end
    for r in (noisy, wide):
        got, _ = grads_after_step(TrainerConfig(max_grad_norm=None), r, copy.deepcopy(model))
        for k in base:
            torch.testing.assert_close(got[k], base[k], rtol=1e-4, atol=1e-7)


def test_causal_attention_alone_gives_real_tokens_the_logits_of_a_padding_mask() -> None:
    """The trainer's forward passes no attention mask (`_logits`): padding only ever follows a row's
    tokens, so each real token's logits must be bitwise those computed with the padding mask."""
    rows = rows_of(3)
    assert len(set(rows.lengths.tolist())) > 1  # rows of several lengths: real padding
    model = tiny_model().eval()
    real = torch.arange(rows.tokens.shape[1])[None, :] < rows.lengths[:, None]
    with torch.no_grad():
        masked = model(input_ids=rows.tokens, attention_mask=real.long()).logits
        ours = _logits(model, rows.tokens)
    assert torch.equal(ours[real], masked[real])


def test_reference_kl_starts_at_zero_and_grows() -> None:
    model = tiny_model()
    cfg = TrainerConfig(lr=1e-2, loss=LossConfig(kl_coef=0.1))
    engine = TrainEngine(model, cfg, CPU, ref_model=copy.deepcopy(model))
    rows = rows_of()
    first = engine.step(rows, 1, float(rows.mask.sum()), float(len(rows)))
    second = engine.step(rows, 2, float(rows.mask.sum()), float(len(rows)))
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-9) and second["kl_ref"] > 1e-6


def test_truncated_is_and_clipping_stats_are_reported() -> None:
    rows = rows_of()
    _, plain = grads_after_step(TrainerConfig(), rows, tiny_model())
    # the synthetic behaviour log-probs are far from the model's (~log 1/98): ratios are far from 1
    assert plain["clip_fraction"] > 0.3 and plain["mismatch.abs"] > 0.5 and plain["is_weight.mean"] == 1.0
    _, tis = grads_after_step(TrainerConfig(loss=LossConfig(tis_cap=2.0)), rows, tiny_model())
    assert tis["clip_fraction"] == 0.0 and 0 < tis["is_weight.mean"] <= 2.0
    assert tis["entropy"] == pytest.approx(plain["entropy"])  # same model, same tokens


def test_bfloat16_autocast_keeps_float32_master_weights() -> None:
    engine = TrainEngine(tiny_model(), TrainerConfig(autocast="bfloat16"), CPU)
    rows = rows_of(1)
    stats = engine.step(rows, 1, float(rows.mask.sum()), float(len(rows)))
    assert torch.isfinite(torch.tensor(stats["loss"]))
    assert all(p.dtype == torch.float32 for p in engine.model.parameters())


def test_entropy_bonus_decays_to_nothing_at_entropy_decay_steps() -> None:
    rows = rows_of(1)
    model = tiny_model()
    loss = LossConfig(entropy_coef=0.5, entropy_decay_steps=4)
    engine = TrainEngine(copy.deepcopy(model), TrainerConfig(loss=loss, max_grad_norm=None), CPU)
    assert [engine.entropy_coef_at(s) for s in (1, 2, 3, 5, 50)] == pytest.approx(
        [0.5, 0.375, 0.25, 0.0, 0.0]
    )

    def grads_at(cfg: TrainerConfig, step: int) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        engine = TrainEngine(copy.deepcopy(model), cfg, CPU)
        stats = engine.step(rows, step, float(rows.mask.sum()), float((rows.mask.sum(-1) > 0).sum()))
        return {k: p.grad.clone() for k, p in engine.model.named_parameters()}, stats

    decaying = TrainerConfig(loss=loss, max_grad_norm=None)
    # step 3: the gradient of a constant bonus of 0.25; step 5: of no bonus at all
    for step, same_as in ((3, 0.25), (5, 0.0)):
        got, stats = grads_at(decaying, step)
        want, _ = grads_at(TrainerConfig(loss=LossConfig(entropy_coef=same_as), max_grad_norm=None), step)
        assert stats["entropy_coef"] == pytest.approx(same_as)
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-8)
    first, _ = grads_at(decaying, 1)
    assert any(not torch.allclose(first[k], got[k]) for k in got)  # the bonus did change the gradient


def test_entropy_control_moves_the_bonus_toward_the_target_and_checkpoints_carry_it() -> None:
    from trainer.checkpoint import optimizer_from_files, optimizer_to_files

    rows = rows_of(1)
    n_tok, n_seq = float(rows.mask.sum()), float(len(rows))
    entropy = TrainEngine(tiny_model(), TrainerConfig(), CPU).step(rows, 1, n_tok, n_seq)["entropy"]
    assert entropy > 0.5
    above = TrainEngine(
        tiny_model(),
        TrainerConfig(
            loss=LossConfig(entropy_coef=0.02, entropy_target=entropy / 2, entropy_adapt_rate=0.01)
        ),
        CPU,
    )
    below = TrainEngine(
        tiny_model(),
        TrainerConfig(
            loss=LossConfig(entropy_coef=0.02, entropy_target=entropy + 1.0, entropy_adapt_rate=0.01)
        ),
        CPU,
    )
    first = below.step(rows, 1, n_tok, n_seq)
    assert first["entropy_coef"] == pytest.approx(0.02)  # the weight it started from
    # below the target the weight grows by rate x gap; above it, it shrinks, and never below 0
    assert below.entropy_coef_at(2) == pytest.approx(
        0.02 + 0.01 * (entropy + 1.0 - first["entropy"]), rel=1e-6
    )
    coefs = []
    for step in range(1, 5):
        coefs.append(above.step(rows, step, n_tok, n_seq)["entropy_coef"])
    assert coefs[0] == pytest.approx(0.02) and coefs[1] < coefs[0] and coefs[-1] == 0.0

    # resumed from a checkpoint, the trainer goes on with the weight it had reached
    tensors, meta = optimizer_to_files(below.optimizer.state_dict())
    resumed = TrainEngine(tiny_model(), below.cfg, CPU)
    resumed.load_optimizer(optimizer_from_files(tensors, json.loads(json.dumps(meta))))
    assert resumed.entropy_coef_at(2) == pytest.approx(below.entropy_coef_at(2))
    assert resumed.entropy_coef_at(2) != pytest.approx(0.02)

    with pytest.raises(ValueError, match="entropy_target .* and entropy_decay_steps"):
        LossConfig(entropy_target=0.3, entropy_decay_steps=100)


@pytest.mark.parametrize(
    "loss",
    [
        {"policy_loss": "ppo"},
        {"policy_loss": "ppo", "tis_cap": 2.0},
        {"policy_loss": "ppo", "dual_clip": 3.0},
        {"policy_loss": "gspo", "clip_low": 3e-4, "clip_high": 4e-4, "aggregation": "seq-mean-token-mean"},
        {"policy_loss": "cispo", "clip_low": 0.9, "clip_high": 4.0},
        {"policy_loss": "m2po"},
        {"policy_loss": "m2po", "aggregation": "constant", "norm_length": 16},
        {"kl_coef": 0.1, "kl_estimator": "k2"},
        {"kl_coef": 0.1, "kl_estimator": "k1", "kl_in": "reward"},
    ],
    ids=lambda d: "-".join(f"{v}" for v in d.values()),
)
def test_every_recipe_loss_trains_without_nan_even_at_extreme_log_ratios(loss: dict) -> None:
    from astraflow.config import Recipe

    recipe = Recipe.model_validate(
        {"name": "t", "trainer": {"lr": 1e-3, "micro_batch_tokens": 48, "loss": loss}}
    )
    model = tiny_model()
    ref = copy.deepcopy(model) if recipe.trainer.loss.kl_coef else None
    engine = TrainEngine(model, recipe.trainer, CPU, ref_model=ref)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    for step in range(1, 5):
        rows = collate(
            [s for g in range(2) for s in make_group("p", f"n{step}{g}", seed=step, size=3)], pad_id=0
        )
        rows.behaviour[:, 6] = -150.0  # log-ratios ~150: far past exp's float32 range
        rows.behaviour[:, 7] = 40.0
        stats = engine.step(rows, step, float(rows.mask.sum()), float((rows.mask.sum(-1) > 0).sum()))
        assert all(math.isfinite(v) for v in stats.values()), stats
    assert all(torch.isfinite(p).all() for p in engine.model.parameters())
    assert any(not torch.equal(before[k], v) for k, v in engine.model.state_dict().items())  # it did train


def test_the_optimiser_is_fused_adamw_and_updates_as_the_per_parameter_loop_does() -> None:
    """The trainer's AdamW is torch's fused one (TRL's default too); three steps of it, weight decay
    included, land where the plain per-parameter AdamW lands, up to float rounding."""
    rows = rows_of()
    cfg = TrainerConfig(lr=1e-2, weight_decay=0.1)
    fused = TrainEngine(tiny_model(), cfg, CPU)
    assert fused.optimizer.param_groups[0]["fused"] is True
    plain = TrainEngine(copy.deepcopy(fused.model), cfg, CPU)
    plain.optimizer = torch.optim.AdamW(
        plain.model.parameters(),
        lr=cfg.lr,
        betas=cfg.betas,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        foreach=False,
    )
    before = {k: p.detach().clone() for k, p in fused.model.named_parameters()}
    for step in (1, 2, 3):
        for engine in (fused, plain):
            engine.step(rows, step, float(rows.mask.sum()), float((rows.mask.sum(-1) > 0).sum()))
    theirs = dict(plain.model.named_parameters())
    for k, p in fused.model.named_parameters():
        assert not torch.equal(p, before[k])  # it trained
        # rounding differs by vector width (AVX-512 or AVX2 kernels): on an AMD EPYC two elements
        # near 0 were 3e-6 apart after 3 steps of lr 1e-2, i.e. 3e-4 of one step. A missing weight
        # decay moves elements by up to 5e-4 here (checked by dropping it from the plain AdamW).
        torch.testing.assert_close(p, theirs[k], rtol=1e-4, atol=1e-5)
