"""The environments and workflows a recipe can name, served by the shared `astraflow.registry`.

`ENVIRONMENTS` (entry point group `astraflow.environments`) and `WORKFLOWS` (`astraflow.workflows`)
map a name to a class. A third-party package registers its own by declaring, in its pyproject.toml,

    [project.entry-points."astraflow.environments"]
    maze = "my_pkg.maze:MazeEnv"

and the recipe names it like a built-in. Nothing is imported until a recipe names it; a plug-in
cannot shadow a built-in; a broken plug-in fails only the recipes naming it; an unknown name fails
at load time listing the known ones.
"""

from __future__ import annotations

from typing import Any

from astraflow.registry import Registry

ENVIRONMENTS = Registry(
    "environment",
    "astraflow.environments",
    {
        "arithmetic": "workers.envs.arithmetic:ArithmeticEnv",
        "guess_number": "workers.envs.guess_number:GuessNumberEnv",
        "search": "workers.envs.search:SearchEnv",
        "code": "workers.envs.code:CodeEnv",
        "referential_game": "workers.envs.referential:ReferentialEnv",
    },
)
WORKFLOWS = Registry(
    "workflow",
    "astraflow.workflows",
    {
        "agent": "workers.workflows.agent:AgentWorkflow",
        # the names recipes use for the same loop
        "single_turn": "workers.workflows.agent:AgentWorkflow",
        "multi_turn": "workers.workflows.agent:AgentWorkflow",
        "solve_and_verify": "workers.workflows.solve_and_verify:SolveAndVerifyWorkflow",
        "referential_game": "workers.workflows.referential:ReferentialWorkflow",
    },
)


def environments() -> dict[str, Any]:
    """The in-process environment registrations; a bench adds its own by assigning into it."""
    return ENVIRONMENTS.local


def environment_class(name: str) -> Any:
    return ENVIRONMENTS.get(name)


def workflow_class(name: str) -> Any:
    return WORKFLOWS.get(name)
