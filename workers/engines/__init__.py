"""Inference engines behind one interface (`Engine`), chosen by `worker.engine.type`.

`ENGINES` maps a type to a builder; `build_engine` validates the type's arguments (unknown keys and
unknown types fail naming the known ones) and builds one engine per policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field

from astraflow.config import StrictModel, validate_model
from astraflow.config.worker import EngineConfig
from astraflow.errors import ConfigError
from workers.engines.base import Engine, GenResult, SamplingParams


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


def _torch(policy: str, model_path: str, args: dict[str, Any], seed: int, version: int) -> Engine:
    from workers.engines.torch_engine import TorchEngine

    a = validate_model(TorchArgs, args, "worker.engine.args (torch)")
    return TorchEngine(policy, model_path, device=a.device, dtype=a.dtype, max_batch=a.max_batch,
                       seed=a.seed * 1_000_003 + seed, version=version, attn_implementation=a.attn_implementation)


def _sglang(policy: str, model_path: str, args: dict[str, Any], seed: int, version: int) -> Engine:
    from workers.engines.sglang_engine import SGLangEngine

    a = validate_model(SGLangArgs, args, "worker.engine.args (sglang)")
    url = a.urls.get(policy, a.url)
    if not url:
        raise ConfigError(f"worker.engine.args: no SGLang url for policy {policy!r} (set url or urls.{policy})")
    return SGLangEngine(policy, url, model_path=model_path, timeout_s=a.timeout_s, pause=a.pause,
                        flush_cache=a.flush_cache, version=version)


ENGINES: dict[str, Callable[[str, str, dict[str, Any], int, int], Engine]] = {"torch": _torch, "sglang": _sglang}


def check_engine(config: EngineConfig) -> None:
    if config.type not in ENGINES:
        raise ConfigError(f"unknown engine type {config.type!r}; known: {', '.join(sorted(ENGINES))}")
    model = TorchArgs if config.type == "torch" else SGLangArgs
    validate_model(model, config.args, f"worker.engine.args ({config.type})")


def build_engine(config: EngineConfig, policy: str, model_path: str, seed: int = 0, version: int = 0) -> Engine:
    check_engine(config)
    return ENGINES[config.type](policy, model_path, config.args, seed, version)


__all__ = ["ENGINES", "Engine", "GenResult", "SGLangArgs", "SamplingParams", "TorchArgs", "build_engine",
           "check_engine"]
