"""The optimiser step: micro-batches accumulate to the one-pass gradient, the reference KL starts at
zero, truncated IS and sequence aggregation run end to end, padding never leaks into the loss."""

from __future__ import annotations

import copy

import pytest
import torch

from astraflow.config.trainer import LossConfig, TrainerConfig
from tests.trainer.helpers import tiny_model
from tests.trainer.synth import make_group
from trainer.engine import Engine, collate, micro_batches

CPU = torch.device("cpu")


def rows_of(n_groups: int = 3):  # type: ignore[no-untyped-def]
    samples = [s for g in range(n_groups) for s in make_group("p", f"e{g}", seed=g, size=3)]
    return collate(samples, pad_id=0)


def grads_after_step(cfg: TrainerConfig, rows, model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict]:  # type: ignore[no-untyped-def]
    engine = Engine(model, cfg, CPU)
    stats = engine.step(rows, 1, float(rows.mask.sum()), float((rows.mask.sum(-1) > 0).sum()))
    return {k: p.grad.clone() for k, p in engine.model.named_parameters()}, stats


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_micro_batches_accumulate_to_the_one_pass_gradient(aggregation: str) -> None:
    rows = rows_of()
    assert len(micro_batches(rows, 40)) > 3  # really split
    model = tiny_model()
    loss = LossConfig(aggregation=aggregation)  # type: ignore[arg-type]
    whole, s1 = grads_after_step(TrainerConfig(micro_batch_tokens=1 << 16, loss=loss, max_grad_norm=None), rows,
                                 copy.deepcopy(model))
    split, s2 = grads_after_step(TrainerConfig(micro_batch_tokens=40, loss=loss, max_grad_norm=None), rows,
                                 copy.deepcopy(model))
    assert s1["loss"] == pytest.approx(s2["loss"], rel=1e-5) and s1["loss_tokens"] == s2["loss_tokens"]
    for k in whole:
        torch.testing.assert_close(split[k], whole[k], rtol=1e-4, atol=1e-7)


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


def test_reference_kl_starts_at_zero_and_grows() -> None:
    model = tiny_model()
    cfg = TrainerConfig(lr=1e-2, loss=LossConfig(kl_coef=0.1))
    engine = Engine(model, cfg, CPU, ref_model=copy.deepcopy(model))
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
    engine = Engine(tiny_model(), TrainerConfig(autocast="bfloat16"), CPU)
    rows = rows_of(1)
    stats = engine.step(rows, 1, float(rows.mask.sum()), float(len(rows)))
    assert torch.isfinite(torch.tensor(stats["loss"]))
    assert all(p.dtype == torch.float32 for p in engine.model.parameters())


def test_entropy_bonus_decays_to_nothing_at_entropy_decay_steps() -> None:
    rows = rows_of(1)
    model = tiny_model()
    loss = LossConfig(entropy_coef=0.5, entropy_decay_steps=4)
    engine = Engine(copy.deepcopy(model), TrainerConfig(loss=loss, max_grad_norm=None), CPU)
    assert [engine.entropy_coef_at(s) for s in (1, 2, 3, 5, 50)] == pytest.approx([0.5, 0.375, 0.25, 0.0, 0.0])

    def grads_at(cfg: TrainerConfig, step: int) -> tuple[dict[str, torch.Tensor], dict]:  # type: ignore[type-arg]
        engine = Engine(copy.deepcopy(model), cfg, CPU)
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
