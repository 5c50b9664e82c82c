"""The bookkeeping of the torch engine's waves (workers/engines/torch_engine.py): a request and its
future, handing results back to the event loops that wait for them, and the rows of a wave decoding
together (their KV cache, masks and sampling settings), which drop finished rows and take in joining
ones between decode steps."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import torch

from workers.engines.base import GenResult, SamplingParams


@dataclass
class Request:
    prompt: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[GenResult]
    result: GenResult = field(default_factory=GenResult)
    cancelled: bool = False


def resolve(fut: asyncio.Future[Any], value: Any = None, exc: BaseException | None = None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)


def resolve_all(done: list[tuple[asyncio.Future[Any], Any]]) -> None:
    for fut, value in done:
        resolve(fut, value)


def hand_back(finished: list[Request]) -> None:
    """Resolve the futures of `finished` with their results, one wake-up of each event loop for all
    of them: a wake-up per request (a write to the loop's self-pipe, then a pass of the loop) was
    ~6% of a worker's CPU at 64 requests a step."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
    for r in finished:
        by_loop.setdefault(r.loop, []).append((r.future, r.result))
    for loop, done in by_loop.items():
        loop.call_soon_threadsafe(resolve_all, done)


@dataclass
class Rows:
    """The requests decoding together; row i of every tensor belongs to rows[i]."""

    rows: list[Request]
    budget: list[int]
    oldest: list[int]  # the oldest weight version in each row's KV cache
    cache: Any  # transformers DynamicCache over `mask`'s positions
    mask: torch.Tensor  # [B, L] attention mask of the cache (0: left padding)
    last_pos: torch.Tensor  # [B] position id of each row's last token
    logits: torch.Tensor  # [B, V] next-token logits
    temps: torch.Tensor
    tops: torch.Tensor
    topks: torch.Tensor

    def select(self, keep: list[int]) -> None:
        idx = torch.tensor(keep, device=self.mask.device)
        self.cache.batch_select_indices(idx)
        self.rows = [self.rows[i] for i in keep]
        self.budget = [self.budget[i] for i in keep]
        self.oldest = [self.oldest[i] for i in keep]
        self.mask, self.last_pos, self.logits, self.temps, self.tops, self.topks = (
            t[idx] for t in (self.mask, self.last_pos, self.logits, self.temps, self.tops, self.topks)
        )

    def extend(self, other: Rows) -> None:
        """Append `other`'s rows: both caches are left-padded to one length and concatenated
        (padding is masked, and positions are per row, so no row sees another's change)."""
        length = max(self.mask.shape[1], other.mask.shape[1])

        def pad(t: torch.Tensor, dim_from_end: int) -> torch.Tensor:
            missing = length - t.shape[-dim_from_end]
            if missing == 0:
                return t
            spec = [0, 0] * (dim_from_end - 1) + [missing, 0]
            return torch.nn.functional.pad(t, spec)

        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([pad(mine.keys, 2), pad(theirs.keys, 2)])
            mine.values = torch.cat([pad(mine.values, 2), pad(theirs.values, 2)])
        self.mask = torch.cat([pad(self.mask, 1), pad(other.mask, 1)])
        self.rows += other.rows
        self.budget += other.budget
        self.oldest += other.oldest
        self.last_pos, self.logits, self.temps, self.tops, self.topks = (
            torch.cat([a, b])
            for a, b in (
                (self.last_pos, other.last_pos),
                (self.logits, other.logits),
                (self.temps, other.temps),
                (self.tops, other.tops),
                (self.topks, other.topks),
            )
        )
