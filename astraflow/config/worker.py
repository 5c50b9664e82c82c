"""Config of the rollout workers (`astraflow worker`). Owned by the workers component.

Names of environments and workflows are checked against the workers' registries when a worker or
the feeder loads the recipe (this module cannot import the component). The engine is a union
discriminated by `type`, so its arguments are checked here, when the recipe loads.
"""

from __future__ import annotations

import math
import random
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from astraflow.config.base import StrictModel


class TorchArgs(StrictModel):
    """Arguments of the `torch` engine."""

    device: str = "cpu"
    """torch device: cpu, cuda, cuda:1 ..."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights and activations dtype (log-probs are always computed in float32)."""
    max_batch: int = Field(default=64, ge=1, le=4096)
    """Most requests decoded together."""
    attn_implementation: str = "sdpa"
    """transformers attention kernel (sdpa, eager)."""
    seed: int = 0
    """Seed of the sampler (mixed with the worker id so workers differ)."""


class SGLangArgs(StrictModel):
    """Arguments of the `sglang` engine."""

    url: str | None = None
    """Base URL of the server serving every policy (http://host:port)."""
    urls: dict[str, str] = Field(default_factory=dict)
    """Per-policy base URLs (override `url`)."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Timeout of one HTTP request."""
    pause: bool = True
    """Pause generation (in place) around a weight update where the server offers it."""
    flush_cache: bool = True
    """Flush the server's prefix cache after a weight update."""


class TorchEngineConfig(StrictModel):
    """The local transformers model, with its own KV-cache sampler (workers/engines/torch_engine.py)."""

    type: Literal["torch"] = "torch"
    args: TorchArgs = TorchArgs()
    """Arguments of the torch engine."""


class SGLangEngineConfig(StrictModel):
    """An HTTP client of SGLang servers (workers/engines/sglang_engine.py)."""

    type: Literal["sglang"]
    args: SGLangArgs = SGLangArgs()
    """Arguments of the sglang engine."""


def _engine_type(value: Any) -> Any:
    """`type` may be left out: the torch engine."""
    return value.get("type", "torch") if isinstance(value, dict) else getattr(value, "type", None)


EngineConfig = Annotated[
    Annotated[TorchEngineConfig, Tag("torch")] | Annotated[SGLangEngineConfig, Tag("sglang")],
    Discriminator(_engine_type),
]
"""Inference engine used for every role, chosen by `type`: `torch` (default) or `sglang`."""


class ToolLatency(StrictModel):
    """Simulated latency of every environment step of an episode (a tool call, a sandbox run, a web
    request), for benchmarks of the dataflow under slow, heavy-tailed tools: each step waits a
    lognormal delay with median `median_s` and log-standard deviation `sigma` (p99/p50 = e^(2.33
    sigma): 10 at sigma 0.99), at most `max_s`, drawn from the episode's own random stream, so the
    same task, attempt and episode waits the same delays wherever it runs. Off by default."""

    median_s: float = Field(default=0.0, ge=0.0, le=600.0)
    sigma: float = Field(default=0.0, ge=0.0, le=5.0)
    max_s: float = Field(default=60.0, gt=0.0, le=3600.0)

    def draw(self, rng: random.Random) -> float:
        """One step's delay in seconds (0 when off)."""
        if self.median_s <= 0:
            return 0.0
        delay = rng.lognormvariate(math.log(self.median_s), self.sigma) if self.sigma > 0 else self.median_s
        return min(delay, self.max_s)


class WorkerConfig(StrictModel):
    """What a rollout worker runs and how much at once."""

    workflow: str | None = None
    """Registered workflow (episode program); None: the task environment's default (`agent` for
    single-policy environments, `referential_game` for the referential game)."""
    workflow_args: dict[str, Any] = Field(default_factory=dict)
    """Arguments of the workflow."""
    env_args: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Run-time arguments per environment name (e.g. `{search: {tool_latency_s: 0.05}}`), applied
    over the feeder's `env_args` for the feeder's environment."""
    engine: EngineConfig = TorchEngineConfig()
    """Inference engine used for every role."""
    temperature: float = Field(default=1.0, le=10.0)
    """Sampling temperature, > 0 (greedy decoding cannot be trained on). The trainer computes its
    log-probs under the same temperature, top_p and top_k (astraflow/sampling.py): these three are
    the one definition of the behaviour distribution."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass (1: off)."""
    top_k: int = Field(default=0, ge=0)
    """Sample among the top_k most likely tokens only (0: off)."""
    max_episodes: int = Field(default=16, ge=1, le=4096)
    """Episodes in flight at once in one worker: the episodes of a task beyond it wait their turn
    (a task's group never starts all at once); see max_queued_episodes for how many wait."""
    max_queued_episodes: int = Field(default=0, ge=0)
    """Episodes of tasks taken but waiting for a slot: the worker takes no more tasks beyond
    max_episodes plus this many, then pauses its partitions. librdkafka hands over the first record
    after a resume ~0.9 s late, so a queue (recipes/arithmetic.yaml: 4 x max_episodes) saves that
    wait on every task; tasks then start with exactly the version they were admitted with, at the
    staleness bound, which is why arithmetic pairs it with `trainer.order: edf`. A stopping worker
    drains queued tasks like running ones (worker.drain_timeout_s); a revoked partition's are
    released to its next owner."""
    max_group_size: int = Field(default=1024, ge=1, le=4096)
    """The largest group_size a worker accepts: a task asking for more is dead-lettered with that
    reason (one task must not be able to queue thousands of episodes or sandboxes)."""
    group: str = "workers"
    """Base name of the consumer group on `tasks` (namespaced like topics)."""
    weights_wait_s: float = Field(default=30.0, ge=0.0, le=3600.0)
    """How long a task waits for the weights it was admitted with (Task.min_versions) before it is
    rolled out with older ones anyway (counted in worker.weights_late; a refused version would
    otherwise stop the worker)."""
    drain_timeout_s: float = Field(default=30.0, ge=0.0, le=3600.0)
    """On SIGTERM, how long in-flight episodes may run on before they are released (not committed,
    so another worker re-runs them)."""
    metrics_every_s: float = Field(default=5.0, gt=0.0, le=3600.0)
    """Period of the worker's Metric records."""
    tool_latency: ToolLatency = ToolLatency()
    """Simulated latency of each environment step (benchmarks; off by default)."""
    count: int = Field(default=1, ge=0, le=256)
    """Workers `astraflow run` starts."""
    regions: list[str] = Field(default_factory=lambda: ["local"])
    """Regions `astraflow run` spreads its workers over (round robin)."""

    @field_validator("temperature")
    @classmethod
    def _trainable_temperature(cls, v: float) -> float:
        if v <= 0:
            raise ValueError(
                f"temperature {v} is greedy decoding, which cannot be trained on (every token has "
                "probability 1 under it: no importance ratio, no policy gradient); use a temperature > 0"
            )
        return v

    @model_validator(mode="after")
    def _sglang_logprobs_are_untruncated(self) -> WorkerConfig:
        # SGLang's output_token_logprobs are log softmax(logits / T): top-p and top-k are applied when
        # sampling but not in the log-probs it returns (sglang srt/layers/sampler.py), so with either
        # the behaviour log-probs would not be those of the distribution sampled from.
        if self.engine.type == "sglang" and (self.top_p < 1.0 or self.top_k > 0):
            raise ValueError(
                f"the sglang engine returns log-probs without top-p/top-k renormalisation, so "
                f"worker.top_p must be 1 and worker.top_k 0 with it (got {self.top_p}, {self.top_k})"
            )
        return self
