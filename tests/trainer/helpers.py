"""Shared helpers of the trainer tests: a tiny model spec and simulated training updates."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from astraflow.config import ModelSpec

if TYPE_CHECKING:
    from trainer.distributed import Dist
    from trainer.rows import Rows

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int) -> list[str]:
    """argv of torchrun starting `nproc` local processes (a free port); the program's argv follows."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
    ]


def run_check(script: str, out: Path, nproc: int, *args: str) -> None:
    """Run a check script (ddp_check.py, fsdp_check.py) on `out` and ARGS, in one process or under
    torchrun as `nproc` processes; fails with the tail of its output when it fails."""
    from tests.conftest import REPO, subprocess_env  # not at import: the check scripts import this module

    out.mkdir()
    argv = [script, str(out), *args]
    cmd = [sys.executable, *argv] if nproc == 1 else [*torchrun(nproc), *argv]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, cwd=REPO, env=subprocess_env(OMP_NUM_THREADS="1")
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def exchanged_batch(dist: Dist, step: int) -> tuple[Rows, float, float]:
    """The check scripts' batch of `step`: rank 0 makes three seeded groups and exchanges them as the
    trainer does; this rank's rows and the global token and sequence counts."""
    from tests.trainer.synth import make_group
    from trainer import distributed
    from trainer.rows import collate

    rows = totals = None
    if dist.leader:
        samples = [s for g in range(3) for s in make_group("p", f"s{step}g{g}", seed=step, size=3)]
        rows = collate(samples, pad_id=0)
        totals = (float(rows.mask.sum()), float((rows.mask.sum(-1) > 0).sum()))
    mine, num_tokens, num_seqs, _ = distributed.exchange(dist, rows, totals or (0.0, 0.0), step)
    assert mine is not None
    return mine, num_tokens, num_seqs
