"""Golden values of the policy-gradient losses (worked out by hand in the comments)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from astraflow.sampling import SamplingSettings
from trainer.aggregation import aggregate
from trainer.losses import (
    KLEstimator,
    LossSettings,
    cispo_loss,
    clipped_pg_loss,
    gspo_loss,
    kl_estimate,
    kl_k3,
    m2po_cut,
    m2po_loss,
    policy_loss,
    token_logprobs,
)

T = torch.tensor


def _grad(loss_fn: Callable[..., torch.Tensor], logp: torch.Tensor) -> tuple[float, Any]:
    logp = logp.clone().requires_grad_(True)
    loss = loss_fn(logp)
    return float(loss.detach()), torch.autograd.grad(loss, logp)[0].tolist()


def test_symmetric_clip_golden_values_and_gradients() -> None:
    behaviour, adv = T([[-1.2, -0.2, -1.0]]), T([[1.0, -1.0, 0.5]])
    # ratios e^0.2 = 1.2214 (clipped to 1.2, adv > 0), e^-0.3 = 0.7408 (clipped to 0.8, adv < 0), 1
    loss, clipped, w = clipped_pg_loss(T([[-1.0, -0.5, -1.0]]), behaviour, adv, clip_low=0.2, clip_high=0.2)
    assert loss.tolist()[0] == pytest.approx([-1.2, 0.8, -0.5])
    assert clipped.tolist() == [[True, True, False]] and w.tolist() == [[1.0, 1.0, 1.0]]
    value, grad = _grad(
        lambda lp: aggregate(
            clipped_pg_loss(lp, behaviour, adv, clip_low=0.2, clip_high=0.2)[0], torch.ones(1, 3), "token"
        ),
        T([[-1.0, -0.5, -1.0]]),
    )
    assert value == pytest.approx((-1.2 + 0.8 - 0.5) / 3)
    assert grad[0] == pytest.approx([0.0, 0.0, -0.5 / 3])  # clipped tokens get no gradient


def test_clip_high_lets_positive_advantages_move_further() -> None:
    # ratio 1.2214 is inside [0.8, 1.28]: not clipped, gradient -A * ratio / N
    value, grad = _grad(
        lambda lp: clipped_pg_loss(lp, T([-1.2]), T([1.0]), clip_low=0.2, clip_high=0.28)[0].sum(), T([-1.0])
    )
    assert value == pytest.approx(-math.exp(0.2)) and grad == pytest.approx([-math.exp(0.2)])


def test_dual_clip_bounds_negative_advantages_only() -> None:
    logp, behaviour = T([-0.1, -0.1]), T([-2.1, -2.1])  # ratio e^2 = 7.389
    adv = T([-1.0, 1.0])
    plain, clipped, _ = clipped_pg_loss(logp, behaviour, adv, clip_low=0.2, clip_high=0.28)
    assert plain.tolist() == pytest.approx([math.exp(2.0), -1.28]) and clipped.tolist() == [False, True]
    dual, clipped, _ = clipped_pg_loss(logp, behaviour, adv, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    assert dual.tolist() == pytest.approx([3.0, -1.28]) and clipped.tolist() == [True, True]
    _, grad = _grad(
        lambda lp: clipped_pg_loss(lp, behaviour, adv, clip_low=0.2, clip_high=0.28, dual_clip=3.0)[0].sum(),
        logp,
    )
    assert grad == [0.0, 0.0]


def test_truncated_importance_sampling_weights_and_gradient() -> None:
    # mu = e^-2, pi = e^-1: weight pi/mu = e = 2.718, truncated to 2; the ratio itself is 1
    for cap, weight in ((2.0, 2.0), (5.0, math.e)):
        value, grad = _grad(
            lambda lp, c=cap: clipped_pg_loss(
                lp, T([-2.0]), T([1.0]), clip_low=0.2, clip_high=0.2, tis_cap=c
            )[0].sum(),
            T([-1.0]),
        )
        assert value == pytest.approx(-weight) and grad == pytest.approx([-weight])


def test_k3_kl_golden_values() -> None:
    assert kl_k3(T([-1.0, -2.0, -0.7]), T([-2.0, -1.0, -0.7])).tolist() == pytest.approx(
        [math.exp(-1) + 1 - 1, math.e - 1 - 1, 0.0]
    )


def test_token_and_sequence_aggregation() -> None:
    per_token = T([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = T([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert float(aggregate(per_token, mask, "token")) == pytest.approx(7 / 3)
    assert float(aggregate(per_token, mask, "sequence")) == pytest.approx((1.5 + 4.0) / 2)
    # global denominators: two halves of a batch add up to the whole
    halves = [aggregate(per_token[i : i + 2], mask[i : i + 2], "sequence", num_seqs=2.0) for i in (0, 2)]
    assert float(sum(halves)) == pytest.approx(2.75)
    assert float(aggregate(per_token[:1], mask[:1], "token", num_tokens=3.0)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean, seq-mean-token-sum, constant"):
        aggregate(per_token, mask, "sum")


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


# ---------------------------------------------------------------- aggregation modes

AGG_TOKENS = T([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
AGG_MASK = T([[1, 1, 0], [1, 0, 0], [0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "value", "grad"),
    [
        # 3 loss tokens (1, 2 | 4) in 2 sequences; row 2 has none and counts for nothing
        ("token-mean", 7 / 3, [[1 / 3, 1 / 3, 0], [1 / 3, 0, 0], [0, 0, 0]]),
        ("seq-mean-token-mean", (1.5 + 4.0) / 2, [[1 / 4, 1 / 4, 0], [1 / 2, 0, 0], [0, 0, 0]]),
        ("seq-mean-token-sum", (3.0 + 4.0) / 2, [[1 / 2, 1 / 2, 0], [1 / 2, 0, 0], [0, 0, 0]]),
        (
            "constant",
            7.0 / (2 * 4),
            [[1 / 8, 1 / 8, 0], [1 / 8, 0, 0], [0, 0, 0]],
        ),  # 2 sequences x norm_length 4
    ],
)
def test_aggregation_modes_golden_values_gradients_and_split_sums(
    mode: str, value: float, grad: list
) -> None:
    x = AGG_TOKENS.clone().requires_grad_(True)
    out = aggregate(x, AGG_MASK, mode, norm_length=4)
    out.backward()
    assert float(out.detach()) == pytest.approx(value)
    assert x.grad.tolist() == [pytest.approx(row) for row in grad]
    # micro-batches (or ranks) given the batch-wide denominators add up to the whole
    parts = [
        aggregate(AGG_TOKENS[i:j], AGG_MASK[i:j], mode, num_tokens=3.0, num_seqs=2.0, norm_length=4)
        for i, j in ((0, 1), (1, 3))
    ]
    assert float(sum(parts)) == pytest.approx(value)


def test_aggregation_old_names_junk_off_the_mask_and_a_missing_norm_length() -> None:
    for old, new in (("token", "token-mean"), ("sequence", "seq-mean-token-mean")):
        assert float(aggregate(AGG_TOKENS, AGG_MASK, old)) == float(aggregate(AGG_TOKENS, AGG_MASK, new))
    junk = AGG_TOKENS.clone()
    junk[2] = math.inf  # an overflowed loss on a masked-out row must not turn the mean into NaN
    assert float(aggregate(junk, AGG_MASK, "token-mean")) == pytest.approx(7 / 3)
    with pytest.raises(ValueError, match="norm_length"):
        aggregate(AGG_TOKENS, AGG_MASK, "constant")


# ---------------------------------------------------------------- log-ratio clamp


def test_a_log_ratio_of_100_overflows_without_the_clamp_and_not_with_it() -> None:
    logp, behaviour, adv = T([0.0]), T([-100.0]), T([-1.0])  # ratio e^100 > float32's max (3.4e38)
    value, grad = _grad(
        lambda lp: clipped_pg_loss(lp, behaviour, adv, clip_low=0.2, clip_high=0.28, log_ratio_clamp=1000.0)[
            0
        ].sum(),
        logp,
    )
    assert math.isinf(value) and not all(math.isfinite(g) for g in grad)
    value, grad = _grad(
        lambda lp: clipped_pg_loss(lp, behaviour, adv, clip_low=0.2, clip_high=0.28, log_ratio_clamp=20.0)[
            0
        ].sum(),
        logp,
    )
    assert value == pytest.approx(math.exp(20.0), rel=1e-6) and grad == [0.0]  # past the clamp: no gradient
    # inside the clamp nothing changes: ratio e^10, gradient -A * ratio
    value, grad = _grad(
        lambda lp: clipped_pg_loss(lp, T([-10.0]), adv, clip_low=0.2, clip_high=0.28)[0].sum(), logp
    )
    assert value == pytest.approx(math.exp(10.0), rel=1e-6) and grad == pytest.approx(
        [math.exp(10.0)], rel=1e-6
    )


@pytest.mark.parametrize(
    "settings",
    [
        LossSettings(),
        LossSettings(tis_cap=2.0),
        LossSettings(dual_clip=3.0),
        LossSettings(policy_loss="gspo"),
        LossSettings(policy_loss="cispo"),
        LossSettings(policy_loss="m2po", m2_threshold=1e6),
        LossSettings(kl_coef=0.1, kl_estimator="k3"),
        LossSettings(kl_coef=0.1, kl_estimator="k2", kl_in="reward"),
    ],
    ids=lambda s: f"{s.policy_loss}-tis{s.tis_cap}-dual{s.dual_clip}-kl{s.kl_estimator}{s.kl_in}{s.kl_coef}",
)
def test_every_loss_is_finite_at_a_log_ratio_of_100(settings: LossSettings) -> None:
    logp = T([[0.0, -1.0, -100.0]]).requires_grad_(True)
    behaviour, ref = T([[-100.0, 100.0, -1.0]]), T([[-100.0, 50.0, 0.0]])  # log-ratios +-100 to mu and to ref
    for adv in (T([[1.0, 1.0, 1.0]]), T([[-1.0, -1.0, -1.0]])):
        loss, stats = policy_loss(logp, behaviour, adv, torch.ones(1, 3), settings, ref_logp=ref)
        (grad,) = torch.autograd.grad(loss, logp)
        assert math.isfinite(float(loss.detach())) and bool(torch.isfinite(grad).all())
        assert all(math.isfinite(v) for v in stats.values())


# ---------------------------------------------------------------- KL estimators


def test_kl_estimators_golden_values_and_gradients() -> None:
    # d = log pi - log ref = 1 and -1
    cases: list[tuple[KLEstimator, list[float], list[float]]] = [
        ("k1", [1.0, -1.0], [1.0, 1.0]),
        ("k2", [0.5, 0.5], [1.0, -1.0]),  # d
        ("k3", [math.exp(-1), math.e - 2], [1 - math.exp(-1), 1 - math.e]),  # e^-d + d - 1; 1 - e^-d
    ]
    for est, values, grads in cases:
        logp = T([-1.0, -2.0]).requires_grad_(True)
        kl = kl_estimate(logp, T([-2.0, -1.0]), est)
        kl.sum().backward()
        assert kl.tolist() == pytest.approx(values) and logp.grad.tolist() == pytest.approx(grads), est
    assert kl_k3(T([-1.0]), T([-2.0])).tolist() == pytest.approx([math.exp(-1)])


def test_what_each_kl_estimator_differentiates_to_in_expectation() -> None:
    """Exact expectations over a 3-token vocabulary: the expected gradient of an estimator used as a
    loss is sum_x pi(x) * d k(x) / d theta (tokens sampled from pi, the sampling not differentiated)."""
    theta = T([0.3, -0.5, 1.1]).requires_grad_(True)
    ref = torch.log_softmax(T([1.0, 0.2, -0.4]), -1)

    def expected_grad(k: KLEstimator) -> torch.Tensor:
        logp = torch.log_softmax(theta, -1)
        (g,) = torch.autograd.grad((logp.exp().detach() * kl_estimate(logp, ref, k)).sum(), theta)
        return g

    def grad_of(f: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        logp = torch.log_softmax(theta, -1)
        (g,) = torch.autograd.grad(f(logp), theta)
        return g

    forward = grad_of(lambda lp: (lp.exp() * (lp - ref)).sum())  # KL(pi || ref)
    reverse = grad_of(lambda lp: (ref.exp() * (ref - lp)).sum())  # KL(ref || pi)
    assert not torch.allclose(forward, reverse, atol=1e-3)
    torch.testing.assert_close(expected_grad("k3"), reverse)  # k3 in the loss: the *reverse* KL
    torch.testing.assert_close(expected_grad("k2"), forward)  # k2 in the loss: KL(pi || ref)
    torch.testing.assert_close(
        expected_grad("k1"), torch.zeros(3), atol=1e-7, rtol=0
    )  # k1 in the loss: nothing
    # k1 in the reward: the on-policy surrogate with advantage -d (detached) has the gradient of KL(pi || ref)
    logp = torch.log_softmax(theta, -1)
    per_token, _, _ = clipped_pg_loss(
        logp, logp.detach(), -kl_estimate(logp, ref, "k1").detach(), clip_low=0.2, clip_high=0.2
    )
    (g,) = torch.autograd.grad((logp.exp().detach() * per_token).sum(), theta)
    torch.testing.assert_close(g, forward)


@pytest.mark.parametrize(("est", "kl"), [("k1", 1.0), ("k3", math.exp(-1))])  # d = 1: k1 = 1, k3 = e^-1
def test_kl_in_the_reward_moves_into_the_advantages(est: KLEstimator, kl: float) -> None:
    logp, ref = T([[-1.0]]), T([[-2.0]])
    settings = LossSettings(kl_coef=0.1, kl_estimator=est, kl_in="reward")
    # on-policy (ratio 1): loss = -(A - 0.1 * kl) and so is its gradient; nothing flows through the KL
    value, grad = _grad(
        lambda lp: policy_loss(lp, lp.detach(), T([[1.0]]), T([[1]]), settings, ref_logp=ref)[0],
        logp,
    )
    assert value == pytest.approx(-(1.0 - 0.1 * kl)) and grad == [pytest.approx([-(1.0 - 0.1 * kl)])]
    in_loss = LossSettings(kl_coef=0.1, kl_estimator=est, kl_in="loss")
    _, stats = policy_loss(logp, logp, T([[1.0]]), T([[1]]), in_loss, ref_logp=ref)
    assert stats["loss"] == pytest.approx(-1.0 + 0.1 * kl) and stats["kl_ref"] == pytest.approx(kl)


# ---------------------------------------------------------------- GSPO, CISPO, M2PO


def test_gspo_one_clipped_ratio_per_sequence() -> None:
    # row 0: log-ratios 0.2, -0.4 -> s = e^-0.1 = 0.905, inside [0.8, 1.2]; its third token is off the mask
    # row 1: log-ratios 0.5, 0.5 -> s = e^0.5 = 1.649: clipped to 1.2 for A > 0
    logp = T([[-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0]])
    behaviour, mask = T([[-1.2, -1.6, -9.0], [-1.5, -1.5, 0.0]]), T([[1, 1, 0], [1, 1, 0]])
    adv = T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, clipped, s = gspo_loss(logp, behaviour, adv, mask, clip_low=0.2, clip_high=0.2)
    assert s[:, 0].tolist() == pytest.approx([math.exp(-0.1), math.exp(0.5)])
    assert loss[:, :2].tolist() == [pytest.approx([-math.exp(-0.1)] * 2), pytest.approx([-1.2, -1.2])]
    assert clipped[:, :2].tolist() == [[False, False], [True, True]]
    # seq-mean-token-mean: d/d logp_t = -A * s / |y| on the unclipped sequence, 0 on the clipped one
    _, grad = _grad(
        lambda lp: aggregate(
            gspo_loss(lp, behaviour, adv, mask, clip_low=0.2, clip_high=0.2)[0], mask, "seq-mean-token-mean"
        ),
        logp,
    )
    assert grad == [pytest.approx([-math.exp(-0.1) / 4] * 2 + [0.0]), [0.0, 0.0, 0.0]]
    # a negative advantage is not clipped above: loss -A * s, gradient -A * s per token
    value, grad = _grad(
        lambda lp: gspo_loss(lp, behaviour[1:], -adv[1:], mask[1:], clip_low=0.2, clip_high=0.2)[0].sum(),
        logp[1:],
    )
    assert value == pytest.approx(2 * math.exp(0.5)) and grad[0][:2] == pytest.approx([math.exp(0.5)] * 2)


def test_gspo_gradient_is_the_papers_sequence_objective() -> None:
    gen = torch.Generator().manual_seed(0)
    logp, behaviour = -torch.rand(3, 5, generator=gen) * 2, -torch.rand(3, 5, generator=gen) * 2
    mask = T([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 1, 1, 1, 0]])
    adv = T([[0.7], [-1.3], [0.4]]).expand(3, 5)
    wide = dict(clip_low=0.99, clip_high=1e3)  # nothing clipped: compare the plain objectives
    _, ours = _grad(
        lambda lp: aggregate(gspo_loss(lp, behaviour, adv, mask, **wide)[0], mask, "seq-mean-token-mean"),
        logp,
    )

    def paper(lp: torch.Tensor) -> torch.Tensor:  # -1/G sum_i A_i exp(mean_t log pi / mu)
        s = torch.exp(((lp - behaviour) * mask).sum(-1) / mask.sum(-1))
        return -(adv[:, 0] * s).mean()

    _, want = _grad(paper, logp)
    assert ours == [pytest.approx(row, abs=1e-6) for row in want]


def test_cispo_keeps_every_gradient_and_clips_only_the_weight() -> None:
    logp, behaviour = T([-1.0, -1.0, -1.0]), T([-1.5, -0.5, -1.0])  # ratios e^0.5 = 1.65, e^-0.5 = 0.61, 1
    adv = T([1.0, 1.0, -1.0])
    loss, clipped, w = cispo_loss(logp, behaviour, adv, clip_low=0.2, clip_high=0.28)
    assert w.tolist() == pytest.approx([1.28, 0.8, 1.0]) and clipped.tolist() == [True, True, False]
    assert loss.tolist() == pytest.approx([1.28, 0.8, -1.0])  # -A * w * log pi
    _, grad = _grad(lambda lp: cispo_loss(lp, behaviour, adv, clip_low=0.2, clip_high=0.28)[0].sum(), logp)
    assert grad == pytest.approx([-1.28, -0.8, 1.0])  # -A * w: PPO would give the first token 0


def test_m2po_cut_masks_the_largest_squares_until_the_second_moment_fits() -> None:
    # squares 4, 1, .01, .01, 0: mean 1.004; without the 4: 1.02 / 4 = .255;
    # without the 1 too: .02 / 3 = .0067
    squares = T([0.01, 4.0, 0.0, 1.0, 0.01])
    assert m2po_cut(squares, 0.04) == 1.0  # masks 4 and 1
    assert m2po_cut(squares, 0.3) == 4.0  # .255 <= .3: masks 4 only
    assert m2po_cut(squares, 1.004) == math.inf  # the mean already fits: nothing
    assert m2po_cut(T([1.0, 1.0]), 0.04) == 1.0  # nothing fits: everything masked
    assert m2po_cut(T([]), 0.04) == math.inf
    # ties at the cut go together (greedy would stop after one 1: [1, 0] has mean .5), so the cut
    # depends on the values alone, never on their order
    assert m2po_cut(T([1.0, 0.0, 1.0]), 0.5) == 1.0


def test_m2po_loss_no_clip_on_kept_tokens_and_the_mean_over_all_tokens() -> None:
    logp, behaviour = T([[-1.0, -1.0]]), T([[-3.0, -1.5]])  # log-ratios 2 (square 4) and .5 (square .25)
    adv, mask = T([[1.0, 1.0]]), T([[1, 1]])
    loss = m2po_loss(logp, behaviour, adv, T([[0, 1]]))
    assert loss.tolist() == [pytest.approx([0.0, -math.exp(0.5)])]  # 1.65 kept: PPO would clip it at 1.28
    settings = LossSettings(policy_loss="m2po", m2_threshold=0.3, aggregation="token-mean")
    value, grad = _grad(lambda lp: policy_loss(lp, behaviour, adv, mask, settings)[0], logp)
    assert value == pytest.approx(-math.exp(0.5) / 2) and grad == [pytest.approx([0.0, -math.exp(0.5) / 2])]
    _, stats = policy_loss(logp, behaviour, adv, mask, settings)
    assert stats["clipped"] == 1.0  # the masked token
    # the trainer's batch-wide mask wins over the call's own tokens
    _, stats = policy_loss(logp, behaviour, adv, mask, settings, m2po_keep=T([[1, 1]]))
    assert stats["clipped"] == 0.0 and stats["loss.pg"] == pytest.approx(-(math.exp(2) + math.exp(0.5)) / 2)


def test_unknown_policy_loss_and_estimator_are_refused() -> None:
    with pytest.raises(ValueError, match="ppo, gspo, cispo, m2po"):
        policy_loss(T([[0.0]]), T([[0.0]]), T([[1.0]]), T([[1]]), LossSettings(policy_loss="grpo"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_estimate(T([0.0]), T([0.0]), "k4")  # type: ignore[arg-type]
