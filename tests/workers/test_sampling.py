"""Golden values of the sampling maths (pure functions): the one behaviour distribution shared by the
torch engine and the trainer (astraflow/sampling.py), and drawing from it."""

from __future__ import annotations

import math

import pytest
import torch

from astraflow.sampling import SamplingSettings, entropy_of
from workers.engines.sampling import sample, sampling_logprobs


def test_plain_softmax_at_temperature_one() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)]])
    lp = sampling_logprobs(logits, torch.tensor([1.0]), torch.tensor([1.0]))
    assert torch.allclose(lp.exp(), torch.tensor([[0.25, 0.75]]))


def test_temperature_scales_logits() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)]])
    lp = sampling_logprobs(logits, torch.tensor([0.5]), torch.tensor([1.0]))
    # softmax(logits / 0.5) = [1, 9] / 10
    assert torch.allclose(lp.exp(), torch.tensor([[0.1, 0.9]]))


def test_top_p_keeps_the_crossing_token_and_renormalises() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    lp = sampling_logprobs(probs.log(), torch.tensor([1.0]), torch.tensor([0.7]))
    # 0.5 < 0.7, 0.5 + 0.3 crosses 0.7: keep {0.5, 0.3} -> [0.625, 0.375, 0, 0]
    assert torch.allclose(lp.exp(), torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    assert torch.isinf(lp[0, 2]) and torch.isinf(lp[0, 3])


def test_greedy_puts_all_mass_on_the_argmax() -> None:
    lp = sampling_logprobs(torch.tensor([[0.1, 2.0, 0.3]]), torch.tensor([0.0]), torch.tensor([1.0]))
    assert lp[0, 1] == 0.0 and torch.isinf(lp[0, 0]) and torch.isinf(lp[0, 2])


def test_rows_use_their_own_parameters() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]])
    lp = sampling_logprobs(logits, torch.tensor([1.0, 0.5]), torch.tensor([1.0, 1.0]))
    assert torch.allclose(lp.exp(), torch.tensor([[0.25, 0.75], [0.1, 0.9]]))


def test_sample_returns_the_logprob_of_the_drawn_token() -> None:
    g = torch.Generator().manual_seed(0)
    lp = sampling_logprobs(torch.randn(64, 10), torch.ones(64), torch.full((64,), 0.9))
    tokens, lps = sample(lp, g)
    assert torch.equal(lps, lp[torch.arange(64), tokens])
    assert torch.isfinite(lps).all()  # never a token outside the nucleus


def test_top_k_keeps_the_k_most_likely_and_renormalises() -> None:
    probs = torch.tensor([[0.1, 0.5, 0.15, 0.25]])
    lp = sampling_logprobs(probs.log(), 1.0, 1.0, 2)
    assert torch.allclose(lp.exp(), torch.tensor([[0.0, 0.5 / 0.75, 0.0, 0.25 / 0.75]]))


def test_top_k_and_top_p_both_read_the_tempered_distribution() -> None:
    # joint (SGLang's order): top-p 0.5 on [0.4, 0.3, 0.2, 0.1] keeps {0, 1}, top-k 2 keeps {0, 1}.
    # Top-p after a top-k renormalisation would read [0.57, 0.43] and keep {0} alone.
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    assert torch.allclose(
        sampling_logprobs(probs.log(), 1.0, 0.5, 2).exp(), torch.tensor([[4 / 7, 3 / 7, 0, 0]])
    )
    assert torch.allclose(sampling_logprobs(probs.log(), 1.0, 1.0, 1).exp(), torch.tensor([[1.0, 0, 0, 0]]))
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    # temperature first: at T = 0.5 the probabilities are [25, 9, 2.25, 0.25] / 36.5, and 25/36.5 = 0.685
    # < 0.7 still needs the second token; at T = 0.25 the first alone has 625/707.6 > 0.7
    assert int(torch.isfinite(sampling_logprobs(probs.log(), 0.5, 0.7)).sum()) == 2
    assert int(torch.isfinite(sampling_logprobs(probs.log(), 0.25, 0.7)).sum()) == 1


def test_scalar_settings_apply_to_every_row_of_any_shape() -> None:
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0))
    per_row = sampling_logprobs(
        logits.reshape(6, 7), torch.full((6,), 0.8), torch.full((6,), 0.9), torch.full((6,), 4)
    )
    assert torch.equal(sampling_logprobs(logits, 0.8, 0.9, 4), per_row.reshape(2, 3, 7))


def test_gradients_flow_through_kept_tokens_only() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]], requires_grad=True)
    lp = sampling_logprobs(logits, 1.0, 0.8)  # keeps tokens 0 and 1 (0.64 < 0.8 <= 0.64 + 0.24)
    assert torch.isinf(lp[0, 2]) and torch.isinf(lp[0, 3])
    lp[0, 0].backward()
    # d log(softmax over {0, 1})[0] / d logits = (1 - p0, -p1, 0, 0), p over the kept pair
    p0 = math.e / (math.e + 1.0)
    assert torch.allclose(logits.grad, torch.tensor([[1 - p0, -(1 - p0), 0.0, 0.0]]))


def test_entropy_of_a_truncated_distribution_is_finite_with_finite_gradients() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]], requires_grad=True)
    h = entropy_of(sampling_logprobs(logits, 1.0, 0.8))
    p0 = math.e / (math.e + 1.0)
    assert float(h.detach()) == pytest.approx(-(p0 * math.log(p0) + (1 - p0) * math.log(1 - p0)))
    h.sum().backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[0, 2:].abs().sum() == 0


def test_training_settings_refuse_greedy() -> None:
    with pytest.raises(ValueError, match="greedy"):
        SamplingSettings(temperature=0.0)
    assert not SamplingSettings().truncated and SamplingSettings(top_k=3).truncated


def test_a_seeded_draw_follows_the_distribution_and_never_takes_an_excluded_token() -> None:
    from workers.engines.sampling import sample_seeded, seeded_noise

    lp = sampling_logprobs(torch.tensor([2.0, 0.0, 1.0, -1.0, 3.0, 0.5]), 1.0, 0.9)  # top-p drops some tokens
    probs = lp.exp()
    counts = torch.zeros(6)
    n = 20_000
    for i in range(n):
        token, logp = sample_seeded(lp, seeded_noise(7, i, 6))
        assert logp == float(lp[token]) and math.isfinite(logp)
        counts[token] += 1
    assert torch.allclose(counts / n, probs, atol=0.015)  # ~4 standard errors at p = 0.5
    assert torch.equal(seeded_noise(7, 3, 6), seeded_noise(7, 3, 6))  # one seed and index, one draw
    assert not torch.equal(seeded_noise(7, 3, 6), seeded_noise(8, 3, 6))
    assert not torch.equal(seeded_noise(7, 3, 6), seeded_noise(7, 4, 6))


def test_one_seed_draws_the_same_token_from_similar_distributions() -> None:
    """What common randomness gives two cooperating policies: with a shared seed, two similar
    distributions agree on most draws; with their own seeds, only as often as chance."""
    from workers.engines.sampling import sample_seeded, seeded_noise

    a = torch.log_softmax(torch.randn(20, generator=torch.Generator().manual_seed(1)), -1)
    b = torch.log_softmax(a + 0.3 * torch.randn(20, generator=torch.Generator().manual_seed(2)), -1)
    shared = sum(
        sample_seeded(a, seeded_noise(s, 0, 20))[0] == sample_seeded(b, seeded_noise(s, 0, 20))[0]
        for s in range(2000)
    )
    own = sum(
        sample_seeded(a, seeded_noise(s, 0, 20))[0] == sample_seeded(b, seeded_noise(s + 10**6, 0, 20))[0]
        for s in range(2000)
    )
    chance = float((a.exp() * b.exp()).sum())
    assert shared / 2000 > 0.7 > 2 * chance and abs(own / 2000 - chance) < 0.05
