"""Plug-in registries of the workers component: plain dicts filled by built-ins and entry points.

`ENVIRONMENTS` (entry point group `astraflow.environments`) and `WORKFLOWS` (`astraflow.workflows`)
map a name to a class. A third-party package registers its own by declaring, in its pyproject.toml,

    [project.entry-points."astraflow.environments"]
    maze = "my_pkg.maze:MazeEnv"

and the recipe names it like a built-in. An unknown name fails at load time listing the known ones.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import Any

from astraflow.errors import ConfigError

log = logging.getLogger(__name__)

_BUILTIN_ENVIRONMENTS = {
    "arithmetic": "workers.envs.arithmetic:ArithmeticEnv",
    "guess_number": "workers.envs.guess_number:GuessNumberEnv",
    "search": "workers.envs.search:SearchEnv",
    "code": "workers.envs.code:CodeEnv",
    "referential_game": "workers.envs.referential:ReferentialEnv",
}
_BUILTIN_WORKFLOWS = {
    "agent": "workers.workflows.agent:AgentWorkflow",
    # the names recipes use for the same loop
    "single_turn": "workers.workflows.agent:AgentWorkflow",
    "multi_turn": "workers.workflows.agent:AgentWorkflow",
    "solve_and_verify": "workers.workflows.solve_and_verify:SolveAndVerifyWorkflow",
    "referential_game": "workers.workflows.referential:ReferentialWorkflow",
}

ENVIRONMENTS: dict[str, Any] = {}
WORKFLOWS: dict[str, Any] = {}


def _import(target: str) -> Any:
    import importlib

    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _fill(registry: dict[str, Any], builtins: dict[str, str], group: str) -> dict[str, Any]:
    if registry:
        return registry
    for name, target in builtins.items():
        registry[name] = _import(target)
    for ep in entry_points(group=group):
        if ep.name in registry:
            log.warning("entry point %s=%s shadows an existing %s", ep.name, ep.value, group)
        try:
            registry[ep.name] = ep.load()
        except Exception as exc:  # a broken plug-in names itself instead of breaking every worker
            raise ConfigError(f"plug-in {ep.name!r} of {group} ({ep.value}) failed to load: {exc}") from exc
    return registry


def environments() -> dict[str, Any]:
    return _fill(ENVIRONMENTS, _BUILTIN_ENVIRONMENTS, "astraflow.environments")


def workflows() -> dict[str, Any]:
    return _fill(WORKFLOWS, _BUILTIN_WORKFLOWS, "astraflow.workflows")


def lookup(registry: dict[str, Any], name: str, kind: str) -> Any:
    try:
        return registry[name]
    except KeyError:
        raise ConfigError(f"unknown {kind} {name!r}; known: {', '.join(sorted(registry))}") from None


def environment_class(name: str) -> Any:
    return lookup(environments(), name, "environment")


def workflow_class(name: str) -> Any:
    return lookup(workflows(), name, "workflow")
