"""Golden values of the policy-gradient losses (worked out by hand in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from astraflow.sampling import SamplingSettings
from trainer.losses import LossSettings, aggregate, clipped_pg_loss, kl_k3, policy_loss, token_logprobs

T = torch.tensor


def _grad(loss_fn, logp):  # type: ignore[no-untyped-def]
    logp = logp.clone().requires_grad_(True)
    loss = loss_fn(logp)
    loss.backward()
    return float(loss.detach()), logp.grad.tolist()


def test_symmetric_clip_golden_values_and_gradients() -> None:
    behaviour, adv = T([[-1.2, -0.2, -1.0]]), T([[1.0, -1.0, 0.5]])
    # ratios e^0.2 = 1.2214 (clipped to 1.2, adv > 0), e^-0.3 = 0.7408 (clipped to 0.8, adv < 0), 1
    loss, clipped, w = clipped_pg_loss(T([[-1.0, -0.5, -1.0]]), behaviour, adv, clip_low=0.2, clip_high=0.2)
    assert loss.tolist()[0] == pytest.approx([-1.2, 0.8, -0.5])
    assert clipped.tolist() == [[True, True, False]] and w.tolist() == [[1.0, 1.0, 1.0]]
    value, grad = _grad(lambda lp: aggregate(clipped_pg_loss(lp, behaviour, adv, clip_low=0.2, clip_high=0.2)[0],
                                             torch.ones(1, 3), "token"), T([[-1.0, -0.5, -1.0]]))
    assert value == pytest.approx((-1.2 + 0.8 - 0.5) / 3)
    assert grad[0] == pytest.approx([0.0, 0.0, -0.5 / 3])  # clipped tokens get no gradient


def test_clip_high_lets_positive_advantages_move_further() -> None:
    # ratio 1.2214 is inside [0.8, 1.28]: not clipped, gradient -A * ratio / N
    value, grad = _grad(lambda lp: clipped_pg_loss(lp, T([-1.2]), T([1.0]), clip_low=0.2, clip_high=0.28)[0].sum(),
                        T([-1.0]))
    assert value == pytest.approx(-math.exp(0.2)) and grad == pytest.approx([-math.exp(0.2)])


def test_dual_clip_bounds_negative_advantages_only() -> None:
    logp, behaviour = T([-0.1, -0.1]), T([-2.1, -2.1])  # ratio e^2 = 7.389
    adv = T([-1.0, 1.0])
    plain, clipped, _ = clipped_pg_loss(logp, behaviour, adv, clip_low=0.2, clip_high=0.28)
    assert plain.tolist() == pytest.approx([math.exp(2.0), -1.28]) and clipped.tolist() == [False, True]
    dual, clipped, _ = clipped_pg_loss(logp, behaviour, adv, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    assert dual.tolist() == pytest.approx([3.0, -1.28]) and clipped.tolist() == [True, True]
    _, grad = _grad(lambda lp: clipped_pg_loss(lp, behaviour, adv, clip_low=0.2, clip_high=0.28,
                                               dual_clip=3.0)[0].sum(), logp)
    assert grad == [0.0, 0.0]


def test_truncated_importance_sampling_weights_and_gradient() -> None:
    # mu = e^-2, pi = e^-1: weight pi/mu = e = 2.718, truncated to 2; the ratio itself is 1
    for cap, weight in ((2.0, 2.0), (5.0, math.e)):
        value, grad = _grad(lambda lp, c=cap: clipped_pg_loss(lp, T([-2.0]), T([1.0]), clip_low=0.2, clip_high=0.2,
                                                             tis_cap=c)[0].sum(), T([-1.0]))
        assert value == pytest.approx(-weight) and grad == pytest.approx([-weight])


def test_k3_kl_golden_values() -> None:
    assert kl_k3(T([-1.0, -2.0, -0.7]), T([-2.0, -1.0, -0.7])).tolist() == pytest.approx(
        [math.exp(-1) + 1 - 1, math.e - 1 - 1, 0.0])


def test_token_and_sequence_aggregation() -> None:
    per_token = T([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = T([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert float(aggregate(per_token, mask, "token")) == pytest.approx(7 / 3)
    assert float(aggregate(per_token, mask, "sequence")) == pytest.approx((1.5 + 4.0) / 2)
    # global denominators: two halves of a batch add up to the whole
    halves = [aggregate(per_token[i : i + 2], mask[i : i + 2], "sequence", num_seqs=2.0) for i in (0, 2)]
    assert float(sum(halves)) == pytest.approx(2.75)
    assert float(aggregate(per_token[:1], mask[:1], "token", num_tokens=3.0)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="token, sequence"):
        aggregate(per_token, mask, "sum")  # type: ignore[arg-type]


def test_token_logprobs_and_entropy() -> None:
    logits = T([[[0.0, math.log(3.0)], [5.0, 5.0]]])  # position 0 predicts token 1: p = 0.25, 0.75
    logp, entropy = token_logprobs(logits, T([[0, 1]]))
    assert logp.item() == pytest.approx(math.log(0.75))
    assert entropy.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    logp_t2, _ = token_logprobs(logits, T([[0, 1]]), SamplingSettings(temperature=2.0))
    assert logp_t2.item() == pytest.approx(math.log(math.sqrt(3) / (1 + math.sqrt(3))))


def test_token_logprobs_are_those_of_the_truncated_sampling_distribution() -> None:
    # position 0: p = [0.5, 0.3, 0.15, 0.05]; top-p 0.7 keeps {0, 1}: [0.625, 0.375, 0, 0]
    logits = torch.log(T([[[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]]])).requires_grad_()
    nucleus = SamplingSettings(top_p=0.7)
    logp, entropy = token_logprobs(logits, T([[0, 1]]), nucleus)
    assert logp.item() == pytest.approx(math.log(0.375))
    assert entropy.item() == pytest.approx(-(0.625 * math.log(0.625) + 0.375 * math.log(0.375)))
    (logp.sum() + entropy.sum()).backward()
    assert torch.isfinite(logits.grad).all()
    assert torch.isinf(token_logprobs(logits, T([[0, 2]]), nucleus)[0]).all()  # outside the nucleus
    # top-k 1 keeps the arg-max only
    assert token_logprobs(logits, T([[0, 0]]), SamplingSettings(top_k=1))[0].item() == 0.0


def test_policy_loss_combines_terms_and_reports_sums() -> None:
    logp, behaviour = T([[-1.0, -2.0, -0.5]]), T([[-1.0, -1.5, -0.5]])
    adv, mask = T([[1.0, 1.0, 1.0]]), T([[1, 1, 0]])
    ref, entropy = T([[-2.0, -1.0, 0.0]]), T([[0.5, 0.7, 9.0]])
    settings = LossSettings(clip_low=0.2, clip_high=0.2, kl_coef=0.1, entropy_coef=0.01)
    loss, stats = policy_loss(logp, behaviour, adv, mask, settings, entropy=entropy, ref_logp=ref)
    # pg: token 0 ratio 1 -> -1; token 1 ratio e^-0.5 = 0.6065 clipped to 0.8 -> max(-0.6065, -0.8)
    pg = (-1.0 - math.exp(-0.5)) / 2
    kl = (math.exp(-1) + 1 - 1 + math.e - 1 - 1) / 2
    assert float(loss) == pytest.approx(pg + 0.1 * kl - 0.01 * 0.6)
    assert stats["tokens"] == 2 and stats["clipped"] == 0
    assert stats["mismatch.abs"] == pytest.approx(0.5)
    assert stats["mismatch.kl"] == pytest.approx(math.exp(-0.5) - 1 + 0.5)
    assert stats["entropy"] == pytest.approx(1.2) and stats["kl_ref"] == pytest.approx(2 * kl)
