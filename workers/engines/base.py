"""The one interface every inference engine offers the workflows.

Token ids in; token ids, behaviour log-probs and per-token weight versions out. Workflows never see
text from an engine, so multi-turn episodes stay token-in, token-out. Engines: `torch` (a local
KV-cache sampler) and `sglang` (an HTTP client of an SGLang server), chosen by `worker.engine.type`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    top_k: int = 0  # 0: no top-k (see astraflow/sampling.py for the distribution these define)
    seed: int | None = None
    """A per-request seed (torch engine): the request's draws then depend on it alone, not on the
    batch it shares or the engine's stream (Gumbel-max with the seed's noise,
    `workers.engines.sampling.sample_seeded`). Requests given one seed share their noise: common
    randomness for cooperating policies."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        from astraflow.sampling import check_truncation  # here: importing the module loads torch

        check_truncation(self.top_p, self.top_k)


@dataclass
class GenResult:
    """What an engine generated for one request. The stop token, when one ended the request, is
    included in `tokens` (it was sampled, so it is trained on)."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str = "length"  # stop | length | aborted


class InferenceEngine(Protocol):
    """An inference engine serving one policy."""

    policy: str

    @property
    def version(self) -> int:
        """Weight version the next decode step will use."""

    async def generate(self, prompt: Sequence[int], params: SamplingParams) -> GenResult:
        """Continue `prompt` (token ids). Cancelling the awaiting task aborts the request."""

    async def update_weights(
        self, state: Mapping[str, torch.Tensor], version: int, source: str | None = None
    ) -> None:
        """Load new weights between decode steps. A token's version is the oldest version that
        influenced it (its KV cache included), so tokens of a request that began before the update
        keep the older version. `source` is a checkpoint directory for engines that load from disk
        (SGLang)."""

    async def close(self) -> None:
        """Abort what is in flight and release resources."""
