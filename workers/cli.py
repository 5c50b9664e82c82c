"""`astraflow worker` and `astraflow feed`. Light to import: the work happens in the commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

RunDir = Annotated[Path | None, typer.Option("--run-dir", help="Run directory (default: recipe.run.dir).")]
Bootstrap = Annotated[
    str | None,
    typer.Option(help="Kafka bootstrap servers (default: recipe, ASTRAFLOW_BOOTSTRAP, or the local broker)."),
]


def _setup(recipe_path: Path, run_dir: Path | None, bootstrap: str | None) -> tuple[Any, Path, Any]:
    """Recipe, run directory and resolved Kafka settings; names in the recipe checked first."""
    from astraflow.config import load_recipe
    from astraflow.kafka import resolve

    recipe = load_recipe(recipe_path)
    check_recipe(recipe)
    rd = run_dir or recipe.run_dir
    base = recipe.kafka
    if bootstrap:
        import os

        os.environ.pop("ASTRAFLOW_BOOTSTRAP", None)
        base = base.model_copy(update={"bootstrap": bootstrap})
    return recipe, rd, resolve(base)


def check_recipe(recipe: Any) -> None:
    """Fail at load time on names the workers' registries do not know (the engine section was
    checked when the recipe loaded)."""
    from workers.registry import environment_class, workflow_class

    env_cls = environment_class(recipe.feeder.env)
    env_cls(**recipe.feeder.env_args)
    for name in recipe.worker.env_args:
        environment_class(name)
    wf_cls = workflow_class(recipe.worker.workflow or env_cls.default_workflow)
    wf_cls(**recipe.worker.workflow_args)
    if any(recipe.trainer_for(p).warmup is not None for p in recipe.policy_names):
        from workers.demonstrations import check

        check(recipe)  # an environment with an expert, played as the agent workflow does
    if recipe.feeder.roles:
        unknown = sorted(set(recipe.feeder.roles.values()) - set(recipe.policy_names))
        if unknown:
            from astraflow.errors import ConfigError

            raise ConfigError(
                f"feeder.roles names unknown policies {unknown}; the recipe has {recipe.policy_names}"
            )


def register(app: typer.Typer) -> None:
    @app.command("worker")
    def worker(
        recipe: Annotated[Path, typer.Option("--recipe", "-r", help="Recipe YAML.")],
        region: Annotated[
            str | None, typer.Option(help="Region of this worker (default: ASTRAFLOW_REGION).")
        ] = None,
        id: Annotated[str | None, typer.Option("--id", help="Worker id (default: host and PID).")] = None,
        run_dir: RunDir = None,
        bootstrap: Bootstrap = None,
    ) -> None:
        """Run a rollout worker: consume tasks, run episodes, publish trajectories."""
        import asyncio

        from transformers.utils import logging as hf_logging

        from astraflow.runner.supervisor import exit_now
        from workers.worker import Worker

        hf_logging.disable_progress_bar()
        cfg, rd, settings = _setup(recipe, run_dir, bootstrap)
        asyncio.run(Worker(cfg, rd, settings, worker_id=id, region=region).run())
        exit_now(0)

    @app.command("feed")
    def feed(
        recipe: Annotated[Path, typer.Option("--recipe", "-r", help="Recipe YAML.")],
        jsonl: Annotated[
            Path | None, typer.Option(help="Tasks from a JSONL file instead of the generator.")
        ] = None,
        run_dir: RunDir = None,
        bootstrap: Bootstrap = None,
        max_tasks: Annotated[
            int | None, typer.Option(help="Stop after this many tasks (overrides the recipe).")
        ] = None,
    ) -> None:
        """Write tasks to the `tasks` topic, with admission control and selective rollout."""
        from astraflow.kafka import wait_for_topics
        from astraflow.runner.supervisor import exit_now
        from workers.feeder import Feeder

        cfg, rd, settings = _setup(recipe, run_dir, bootstrap)
        wait_for_topics(settings, ["tasks", "weights"])  # started by `astraflow run` while its broker boots
        if max_tasks is not None:
            cfg = cfg.model_copy(update={"feeder": cfg.feeder.model_copy(update={"max_tasks": max_tasks})})
        n = Feeder(cfg, rd, settings, jsonl=jsonl).run()
        typer.echo(f"fed {n} tasks", err=True)
        exit_now(0)
