"""Shared helpers of the trainer tests: a tiny model spec and simulated training updates."""

from __future__ import annotations

import torch

from astraflow.config import ModelSpec

TINY = ModelSpec(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)


def tiny_model(spec: ModelSpec = TINY) -> torch.nn.Module:
    from astraflow.models import build_model

    return build_model(spec)


def nudge(model: torch.nn.Module, gen: torch.Generator, scale: float = 1e-3) -> None:
    """An update shaped like an optimiser step: small relative changes to every parameter."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * (p.abs().mean() + 1e-3))


def bits(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Raw bits of every tensor, so equality below is bit equality (not float equality)."""
    by_size = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return {k: v.contiguous().view(by_size[v.element_size()]).clone() for k, v in state.items()}


def assert_bit_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    ba, bb = bits(a), bits(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(ba[k], bb[k]), f"{k} differs"


def published(model: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    return {k: v.detach().to(dtype) for k, v in model.state_dict().items()}
