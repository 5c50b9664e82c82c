"""The shared-prefix forward (trainer/prefix.py): the packed rows give every row's logits and
gradients as its own forward does, for sdpa and eager attention, and a step trains the same with it
as without; packing is skipped where it would not pay."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from astraflow.config.trainer import TrainerConfig
from astraflow.sampling import SamplingSettings
from tests.trainer.helpers import tiny_model
from tests.trainer.synth import make_group
from trainer.engine import TrainEngine
from trainer.losses import token_logprobs
from trainer.prefix import packed_logits, plan_packing
from trainer.rows import Rows, _logits, collate

CPU = torch.device("cpu")
SAMPLING = SamplingSettings()


def grouped_rows(n_groups: int = 3, size: int = 4, prompt: int = 5, seed: int = 0) -> Rows:
    """Groups whose members share their prompt (as GRPO's do), with completions of 1 to 6 tokens;
    in the first group every member also begins its completion with the same token, and one member
    of the last group repeats another whole."""
    rng = np.random.default_rng(seed)
    samples = []
    for g in range(n_groups):
        group = make_group("p", f"e{g}", seed=g, size=size)
        head = rng.integers(4, 90, prompt)
        for k, s in enumerate(group):
            own = rng.integers(4, 90, int(rng.integers(1, 7)))
            if g == 0 and k > 0:
                own[0] = group[0].tokens[prompt]
            s.tokens = np.concatenate([head, own]).astype(np.int32)
            s.loss_mask = np.r_[np.zeros(prompt), np.ones(len(own))].astype(np.uint8)
            s.logprobs = np.where(s.loss_mask, -1.0, 0.0).astype(np.float32)
            s.versions = np.where(s.loss_mask, 0, -1).astype(np.int32)
            s.advantages = (s.loss_mask * (k - size / 2)).astype(np.float32)
        if g == n_groups - 1:
            last = group[-1]
            last.tokens, last.loss_mask = group[0].tokens.copy(), group[0].loss_mask.copy()
            last.logprobs, last.versions = group[0].logprobs.copy(), group[0].versions.copy()
            last.advantages = group[0].advantages.copy()
        samples += group
    return collate(samples, pad_id=0)


def attention(model: torch.nn.Module, kind: str) -> torch.nn.Module:
    model.config._attn_implementation = kind
    return model


@pytest.mark.parametrize("kind", ["sdpa", "eager"])
def test_packed_rows_give_each_rows_logits_and_gradients(kind: str) -> None:
    rows = grouped_rows()
    packing = plan_packing(rows.tokens, rows.lengths, rows.mask, 0, hidden_size=32)
    assert packing is not None and packing.tokens.shape[0] == 3  # one packed row a group
    assert packing.positions_run < 0.8 * rows.tokens.numel()
    # the first group shares its prompt and its members' common first token: members start after both
    assert int(packing.positions[0, 6]) == 6 and int(packing.positions[1, 5]) == 5
    model = attention(tiny_model(), kind)
    twin = copy.deepcopy(model)
    own = _logits(model, rows.tokens)
    packed = packed_logits(twin, packing, CPU, additive=kind == "eager")
    real = torch.arange(rows.tokens.shape[1])[None, :] < rows.lengths[:, None]
    torch.testing.assert_close(packed[real], own[real], rtol=1e-5, atol=1e-5)

    def loss(logits: torch.Tensor) -> torch.Tensor:
        logp = token_logprobs(logits, rows.tokens, SAMPLING, with_entropy=False)[0]
        return -(logp * rows.mask * rows.advantages).sum() / rows.mask.sum()

    loss(own).backward()
    loss(packed).backward()
    grads = dict(twin.named_parameters())
    for name, p in model.named_parameters():
        assert p.grad is not None and float(p.grad.abs().max()) > 0
        torch.testing.assert_close(grads[name].grad, p.grad, rtol=1e-4, atol=1e-6)


def test_a_step_trains_the_same_with_and_without_packing() -> None:
    rows = grouped_rows(n_groups=4, size=8)
    model = tiny_model()
    after = {}
    for shared in (False, True):
        engine = TrainEngine(copy.deepcopy(model), TrainerConfig(shared_prefix=shared), CPU)
        stats = engine.step(rows, 1, float(rows.mask.sum()), float((rows.mask.sum(-1) > 0).sum()))
        after[shared] = (dict(engine.model.named_parameters()), stats)
    (plain, s0), (packed, s1) = after[False], after[True]
    assert s0["positions_saved"] == 0.0 and s1["positions_saved"] > 0.3
    assert s1["loss"] == pytest.approx(s0["loss"], rel=1e-4, abs=1e-6)
    assert s1["mismatch.abs"] == pytest.approx(s0["mismatch.abs"], abs=1e-5)
    for name, p in plain.items():
        torch.testing.assert_close(packed[name], p, rtol=1e-5, atol=1e-6)


def test_packing_is_skipped_where_it_does_not_pay() -> None:
    # every row its own prompt: nothing to share
    distinct = collate([s for g in range(3) for s in make_group("p", f"d{g}", seed=g, size=4)], pad_id=0)
    assert plan_packing(distinct.tokens, distinct.lengths, distinct.mask, 0, hidden_size=32) is None
    # groups of 4 with a 30-token prompt and 60-token completions: a quarter of the positions saved,
    # but each packed row's dense attention (270 x 270) outweighs that in a model this small
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(4, 90, (3, 30), generator=gen).repeat_interleave(4, 0)
    tokens = torch.cat([prompts, torch.randint(4, 90, (12, 60), generator=gen)], 1)
    lengths = torch.full((12,), 90)
    mask = (torch.arange(89) >= 29).float().expand(12, 89)
    assert plan_packing(tokens, lengths, mask, 0, hidden_size=32) is None
    packing = plan_packing(tokens, lengths, mask, 0, hidden_size=4096)  # wide layers: it pays
    assert packing is not None and packing.positions_run == 3 * 270
