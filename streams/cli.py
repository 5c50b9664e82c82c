"""`astraflow streams`: run the streams worker (a Faust worker) for a recipe.

Light to import: Faust and the pipeline are imported inside the command. SIGTERM and SIGINT
stop the worker cleanly (Faust finishes the current event, flushes its producer, commits, closes
the consumer) and it exits 0; a SIGKILL loses nothing (see streams/emit.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def run_dir_for(recipe_path: Path, run_dir: Path | None) -> Path:
    from astraflow.config import load_recipe

    if run_dir is not None:
        return run_dir
    recipe = load_recipe(recipe_path)
    return recipe.run_dir


def register(app: typer.Typer) -> None:
    @app.command("streams")
    def streams(
        recipe: Annotated[Path, typer.Option("--recipe", "-r", help="Recipe YAML.")],
        run_dir: Annotated[
            Path | None,
            typer.Option(
                "--run-dir",
                help="Run directory (default: the recipe's "
                "run.dir). The Faust data directory goes in <run-dir>/streams "
                "unless --data-dir or streams.data_dir says otherwise.",
            ),
        ] = None,
        data_dir: Annotated[Path | None, typer.Option("--data-dir", help="Faust data directory.")] = None,
        log_level: Annotated[
            str | None,
            typer.Option(
                "--log-level", "-l", help="crit, error, warn, info or debug (default: streams.log_level)."
            ),
        ] = None,
        web_port: Annotated[
            int | None, typer.Option(help="Serve Faust's web pages on this port (default: off).")
        ] = None,
        instance_id: Annotated[
            str | None, typer.Option(help="Id in Metric records (default: streams-<host>-<pid>).")
        ] = None,
        check: Annotated[
            bool,
            typer.Option("--check", help="Build the pipeline, check the topics, print the stages and exit."),
        ] = False,
    ) -> None:
        """Run the streams worker: the recipe's pipeline of data algorithms, trajectories -> samples."""
        from astraflow.config import load_recipe

        cfg = load_recipe(recipe)
        level = log_level or cfg.streams.log_level
        if level not in ("crit", "error", "warn", "info", "debug"):
            raise typer.BadParameter(
                f"{level!r} is not one of crit, error, warn, info, debug", param_hint="--log-level"
            )
        rd = run_dir_for(recipe, run_dir)
        ddir = data_dir or (Path(cfg.streams.data_dir) if cfg.streams.data_dir else rd / "streams")

        from streams.app import create_app

        faust_app = create_app(cfg, data_dir=ddir, web_port=web_port, instance_id=instance_id)
        runtime = faust_app.astraflow
        if check:
            typer.echo(f"app {faust_app.conf.id} on {runtime.settings.bootstrap}; data dir {ddir}")
            typer.echo("pipeline: " + " -> ".join(runtime.pipeline.names))
            return
        from streams.faust_glue import QuietWorker

        worker = QuietWorker(faust_app, loglevel=level, quiet=True)
        worker.execute_from_commandline()
