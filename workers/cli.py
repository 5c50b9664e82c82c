"""`astraflow worker` and `astraflow feed`. Light to import: the work happens in the commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("worker")
    def worker(
        recipe: Annotated[Path, typer.Option("--recipe", "-r", help="Recipe YAML.")],
        region: Annotated[str | None, typer.Option(help="Region of this worker (default: ASTRAFLOW_REGION).")] = None,
        id: Annotated[str | None, typer.Option("--id", help="Worker id (default: host and PID).")] = None,
    ) -> None:
        """Run a rollout worker: consume tasks, run episodes, publish trajectories."""
        raise typer.Exit(_not_yet("worker"))

    @app.command("feed")
    def feed(
        recipe: Annotated[Path, typer.Option("--recipe", "-r", help="Recipe YAML.")],
        jsonl: Annotated[Path | None, typer.Option(help="Tasks from a JSONL file instead of the generator.")] = None,
    ) -> None:
        """Write tasks to the `tasks` topic, with admission control."""
        raise typer.Exit(_not_yet("feed"))


def _not_yet(name: str) -> int:
    typer.echo(f"`astraflow {name}` arrives with the workers issue (#3)", err=True)
    return 2
