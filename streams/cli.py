"""`astraflow streams`. Light to import: Faust is imported inside the command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("streams")
    def streams(
        recipe: Annotated[Path, typer.Option("--recipe", "-r", help="Recipe YAML.")],
    ) -> None:
        """Run the streams worker: the recipe's pipeline of data algorithms."""
        typer.echo("`astraflow streams` arrives with the streams issue (#4)", err=True)
        raise typer.Exit(2)
