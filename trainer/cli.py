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
        run_dir: Annotated[
            Path | None,
            typer.Option(
                "--run-dir", help="Run directory (default: the recipe's run.dir with {name} replaced)."
            ),
        ] = None,
        max_steps: Annotated[
            int | None,
            typer.Option(
                "--max-steps",
                help="Stop after this many steps (default: trainer.max_steps, then run.max_steps).",
            ),
        ] = None,
    ) -> None:
        """Train one policy from its samples topic and publish its weights.

        Run one per policy. Under torchrun (`torchrun --nproc-per-node N -m astraflow.cli trainer ...`)
        the processes train data-parallel; rank 0 talks to Kafka. SIGTERM/SIGINT finish the current
        step, checkpoint and exit 0."""
        from astraflow.config import load_recipe
        from astraflow.kafka import resolve
        from astraflow.runner.supervisor import exit_now
        from trainer.service import Trainer

        loaded = load_recipe(recipe)
        loaded.model_for(policy)  # an unknown policy fails before anything connects
        service = Trainer(
            loaded, policy, run_dir=run_dir, settings=resolve(loaded.kafka), max_steps=max_steps
        )
        exit_now(service.run())
