"""`astraflow run` and `astraflow status`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        recipe: Annotated[Path, typer.Argument(help="Recipe YAML.")],
        max_steps: Annotated[
            int | None, typer.Option(help="Stop when every trainer made this many steps.")
        ] = None,
        max_minutes: Annotated[float | None, typer.Option(help="Stop after this many minutes.")] = None,
        run_dir: Annotated[
            Path | None,
            typer.Option(
                "--run-dir", help="Run directory (default: recipe.run.dir); an existing one is resumed."
            ),
        ] = None,
        workers: Annotated[int | None, typer.Option(help="Rollout workers (default: worker.count).")] = None,
        dashboard: Annotated[
            bool | None,
            typer.Option("--dashboard/--no-dashboard", help="Live dashboard (default: on a terminal)."),
        ] = None,
        secure: Annotated[
            bool,
            typer.Option(
                "--secure",
                help="Run on a secured local broker: SASL_SSL with "
                "SCRAM-SHA-512, one principal per component kind, least-privilege "
                "ACLs.",
            ),
        ] = False,
    ) -> None:
        """Run a recipe end to end: broker, topics, trainers, streams, workers and feeder."""
        import sys

        from astraflow.runner.plan import RunOptions
        from astraflow.runner.run import Run
        from astraflow.runner.supervisor import exit_now

        show = sys.stderr.isatty() if dashboard is None else dashboard
        summary = Run(
            recipe,
            RunOptions(
                max_steps=max_steps,
                max_minutes=max_minutes,
                run_dir=run_dir,
                dashboard=show,
                workers=workers,
                secure=secure,
            ),
        ).execute()
        exit_now(1 if summary.get("failed") else 0)  # its components and broker are gone, its report written

    @app.command("status")
    def status(
        recipe: Annotated[
            Path | None, typer.Option("--recipe", "-r", help="Recipe YAML (policies, Kafka).")
        ] = None,
        bootstrap: Annotated[str | None, typer.Option(help="Kafka bootstrap servers.")] = None,
        run_dir: Annotated[
            Path | None, typer.Option("--run-dir", help="Run directory whose broker to use.")
        ] = None,
        since: Annotated[float, typer.Option(help="Only metrics of the last this many seconds.")] = 600.0,
        wait: Annotated[float, typer.Option(help="Seconds to read the topics before printing.")] = 4.0,
    ) -> None:
        """Show the dashboard of a running system, from any shell."""
        from astraflow.runner.status import show_status

        raise typer.Exit(show_status(recipe, bootstrap, run_dir, since, wait))
