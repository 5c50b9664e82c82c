"""The data algorithms a recipe's `streams.pipeline` can name: built-ins plus plug-ins declared
under the `astraflow.algorithms` entry point group, served by the shared `astraflow.registry`
(lazy; a plug-in cannot shadow a built-in; a broken plug-in fails only the recipe naming it; an
unknown name fails listing the known ones). `validate`, `group` and `route` are not here: they are
not algorithms a recipe places, but the fixed stages around the pipeline, configured by sections
of their own (`streams.validate`, `streams.group`), and a recipe cannot list them.

A registry entry is a factory (normally a class) called with the stage's `args` as keyword
arguments; `instantiate` checks those arguments against its signature.
"""

from __future__ import annotations

import inspect
from typing import Any

from astraflow.errors import ConfigError
from astraflow.registry import Registry

ENTRY_POINT_GROUP = "astraflow.algorithms"

#: name -> "module:attribute" of the built-in algorithms (imported on use).
BUILTINS: dict[str, str] = {
    "zero_variance": "streams.filters:ZeroVariance",
    "truncated": "streams.filters:Truncated",
    "errored": "streams.filters:Errored",
    "max_staleness": "streams.filters:MaxStaleness",
    "length": "streams.filters:Length",
    "grpo": "streams.advantages:GRPO",
    "dr_grpo": "streams.advantages:DrGRPO",
    "rloo": "streams.advantages:RLOO",
    "reinforce_pp_baseline": "streams.advantages:ReinforcePPBaseline",
    "reinforce_pp": "streams.advantages:ReinforcePP",
    "task_stats": "streams.stats:TaskStatsStage",
    "replay": "streams.reuse:Replay",
    "mix": "streams.reuse:Mix",
}

ALGORITHMS = Registry("algorithm", ENTRY_POINT_GROUP, BUILTINS)


def instantiate(name: str, args: dict[str, Any], where: str) -> Any:
    """Build one stage from its factory and recipe arguments; bad arguments are ConfigErrors."""
    try:
        factory = ALGORITHMS.get(name)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        params = sig.parameters.values()
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            allowed = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
            unknown = sorted(set(args) - allowed)
            if unknown:
                raise ConfigError(
                    f"{where}: unknown argument {unknown[0]!r} of {name!r}; "
                    f"it takes: {', '.join(sorted(allowed)) or 'no arguments'}"
                )
    try:
        return factory(**args)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: bad arguments for {name!r}: {exc}") from None
