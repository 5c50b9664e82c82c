"""`astraflow trainer`. Light to import: torch is imported inside the command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("trainer")
    def trainer(
        recipe: Annotated[Path, typer.Option("--recipe", "-r", help="Recipe YAML.")],
        policy: Annotated[str, typer.Option(help="Policy this trainer trains.")],
    ) -> None:
        """Train one policy from its samples topic and publish its weights."""
        typer.echo("`astraflow trainer` arrives with the trainer issue (#5)", err=True)
        raise typer.Exit(2)
