"""Golden values of the sampling maths (pure functions)."""

from __future__ import annotations

import math

import torch

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
