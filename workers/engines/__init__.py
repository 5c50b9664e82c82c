"""Inference engines behind one interface (`InferenceEngine`), chosen by `worker.engine.type`.

The recipe's engine section is a union discriminated by `type` (astraflow/config/worker.py), so a
loaded recipe's engine arguments are already typed and checked; `build_engine` builds one engine
per policy from them.
"""

from __future__ import annotations

from astraflow.config.worker import EngineConfig, SGLangArgs, SGLangEngineConfig, TorchArgs, TorchEngineConfig
from astraflow.errors import ConfigError
from workers.engines.base import GenResult, InferenceEngine, SamplingParams


def _torch(policy: str, model_path: str, a: TorchArgs, seed: int, version: int) -> InferenceEngine:
    from workers.engines.torch_engine import TorchEngine

    return TorchEngine(
        policy,
        model_path,
        device=a.device,
        dtype=a.dtype,
        max_batch=a.max_batch,
        seed=a.seed * 1_000_003 + seed,
        version=version,
        attn_implementation=a.attn_implementation,
    )


def _sglang(policy: str, model_path: str, a: SGLangArgs, version: int) -> InferenceEngine:
    from workers.engines.sglang_engine import SGLangEngine

    url = a.urls.get(policy, a.url)
    if not url:
        raise ConfigError(
            f"worker.engine.args: no SGLang url for policy {policy!r} (set url or urls.{policy})"
        )
    return SGLangEngine(
        policy,
        url,
        model_path=model_path,
        timeout_s=a.timeout_s,
        pause=a.pause,
        flush_cache=a.flush_cache,
        version=version,
    )


def build_engine(
    config: EngineConfig, policy: str, model_path: str, seed: int = 0, version: int = 0
) -> InferenceEngine:
    if isinstance(config, TorchEngineConfig):
        return _torch(policy, model_path, config.args, seed, version)
    assert isinstance(config, SGLangEngineConfig)  # the union has two members
    return _sglang(policy, model_path, config.args, version)


__all__ = ["InferenceEngine", "GenResult", "SGLangArgs", "SamplingParams", "TorchArgs", "build_engine"]
