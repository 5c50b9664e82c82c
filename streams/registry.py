"""The algorithm registry: built-ins plus plug-ins found through the `astraflow.algorithms` entry
point group. A recipe names either kind the same way; an unknown name fails when the pipeline is
built, listing the known names.

A registry entry is a factory (normally a class) called with the stage's `args` as keyword
arguments. Plug-ins are loaded only when a recipe names them, so a broken plug-in package cannot
break a pipeline that does not use it. A plug-in may not shadow a built-in name (it is ignored,
with a warning).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from importlib import metadata
from typing import Any

from astraflow.errors import ConfigError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "astraflow.algorithms"

#: name -> "module:attribute" of the built-in algorithms (imported on use).
BUILTINS: dict[str, str] = {
    "validate": "streams.validate:Validate",
    "group": "streams.grouping:GroupStage",
    "zero_variance": "streams.filters:ZeroVariance",
    "truncated": "streams.filters:Truncated",
    "errored": "streams.filters:Errored",
    "max_staleness": "streams.filters:MaxStaleness",
    "length": "streams.filters:Length",
    "grpo": "streams.advantages:GRPO",
    "dr_grpo": "streams.advantages:DrGRPO",
    "rloo": "streams.advantages:RLOO",
    "reinforce_pp_baseline": "streams.advantages:ReinforcePPBaseline",
    "task_stats": "streams.stats:TaskStatsStage",
    "replay": "streams.reuse:Replay",
    "mix": "streams.reuse:Mix",
    "route": "streams.route:Route",
}


def _import(target: str) -> Any:
    import importlib

    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def plugin_entry_points() -> dict[str, metadata.EntryPoint]:
    """Entry points of the `astraflow.algorithms` group, by name (built-in names excluded)."""
    found: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in BUILTINS:
            log.warning("plug-in %s (%s) ignored: %r is a built-in algorithm", ep.value, ep.name, ep.name)
            continue
        found.setdefault(ep.name, ep)
    return found


def known_names() -> list[str]:
    return sorted({*BUILTINS, *plugin_entry_points()})


def resolve(name: str) -> Callable[..., Any]:
    """The factory registered under `name`. Raises ConfigError listing the known names."""
    if name in BUILTINS:
        return _import(BUILTINS[name])
    eps = plugin_entry_points()
    if name in eps:
        try:
            return eps[name].load()
        except Exception as exc:  # a plug-in's import error is the user's config problem
            raise ConfigError(f"streams.pipeline: plug-in algorithm {name!r} ({eps[name].value}) "
                              f"failed to load: {type(exc).__name__}: {exc}") from exc
    raise ConfigError(f"streams.pipeline: unknown algorithm {name!r}; known: {', '.join(known_names())}")


def instantiate(name: str, args: dict[str, Any], where: str) -> Any:
    """Build one stage from its factory and recipe arguments; bad arguments are ConfigErrors."""
    factory = resolve(name)
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
                raise ConfigError(f"{where}: unknown argument {unknown[0]!r} of {name!r}; "
                                  f"it takes: {', '.join(sorted(allowed)) or 'no arguments'}")
    try:
        return factory(**args)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: bad arguments for {name!r}: {exc}") from None
