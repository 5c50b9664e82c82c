"""Multi-process training under torchrun: rank 0 leads, every rank computes.

Rank 0 (the leader) is the only one that talks to Kafka, writes checkpoints and publishes
weights. Each iteration it broadcasts a small header (idle, batch, or stop) and, for a batch, the
padded batch tensors; every rank trains its share of the rows (rows r, r+W, r+2W, ...) and DDP
all-reduces the gradients. Control messages always go over a gloo group, so the data plane may be
NCCL on GPUs. Nothing is pickled: only tensors cross process boundaries. A stop requested on any
rank (SIGTERM from torchrun reaches them all) is agreed by an all-reduce before anyone leaves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from trainer.rows import Rows

IDLE, BATCH = 0, 1


@dataclass
class Dist:
    """This process's place in the job (a single process is rank 0 of 1)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    group: Any = None  # gloo group for control messages

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def init(device_type: str) -> Dist:
    """Join the torchrun job described by the environment, if any."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as td

    backend = "nccl" if device_type == "cuda" else "gloo"
    td.init_process_group(backend=backend)
    group = td.new_group(backend="gloo") if backend != "gloo" else td.group.WORLD
    return Dist(td.get_rank(), td.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")), group)


def shutdown(dist: Dist) -> None:
    if dist.enabled:
        import torch.distributed as td

        td.barrier(group=dist.group)
        td.destroy_process_group()


def agree_stop(dist: Dist, local_stop: bool) -> bool:
    """True on every rank if any rank wants to stop."""
    if not dist.enabled:
        return local_stop
    import torch.distributed as td

    flag = torch.tensor([int(local_stop)])
    td.all_reduce(flag, op=td.ReduceOp.MAX, group=dist.group)
    return bool(flag.item())


def exchange(
    dist: Dist, rows: Rows | None, totals: tuple[float, float] = (0.0, 0.0), step: int = 0
) -> tuple[Rows | None, float, float, int]:
    """Leader: send `rows` (or None for an idle round). Others: receive. Everyone gets back its own
    share of the rows, the batch-wide loss-token and sequence counts, and the step number."""
    if not dist.enabled:
        return rows, totals[0], totals[1], step
    import torch.distributed as td

    header = torch.zeros(6, dtype=torch.float64)
    if dist.leader and rows is not None:
        header[:] = torch.tensor(
            [BATCH, rows.tokens.shape[0], rows.tokens.shape[1], totals[0], totals[1], step]
        )
    td.broadcast(header, src=0, group=dist.group)
    cmd, n, length, num_tokens, num_seqs, step_no = header.tolist()
    if int(cmd) != BATCH:
        return None, 0.0, 0.0, int(step_no)
    n, length = int(n), int(length)
    if dist.leader:
        assert rows is not None
        tensors = rows.tensors()
    else:
        tensors = [
            torch.empty(n, length, dtype=torch.int64),
            torch.empty(n, dtype=torch.int64),
            *(torch.empty(n, length - 1, dtype=torch.float32) for _ in range(3)),
        ]
    for t in tensors:
        td.broadcast(t, src=0, group=dist.group)
    full = Rows(*tensors)
    mine = full.select(torch.arange(dist.rank, n, dist.world)) if dist.rank < n else empty_rows()
    return mine, num_tokens, num_seqs, int(step_no)


def empty_rows() -> Rows:
    return Rows(
        torch.zeros(0, 2, dtype=torch.int64),
        torch.zeros(0, dtype=torch.int64),
        *(torch.zeros(0, 1) for _ in range(3)),
    )
