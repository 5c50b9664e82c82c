"""The `astraflow` command line.

Shared commands live here (`topics`, `compose`) and in broker_cli.py (`broker`); each component
registers its own commands (`worker`, `feed`, `streams`, `trainer`, ...) through a `register(app)`
function in its `cli` module, which must stay light to import (torch is imported inside the commands).
"""

from __future__ import annotations

import faulthandler
import importlib
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from astraflow import broker_cli
from astraflow.cli_output import console, fail, out
from astraflow.config.kafka import KafkaSettings
from astraflow.errors import AstraFlowError

COMPONENT_CLIS = ("workers.cli", "streams.cli", "trainer.cli", "astraflow.runner.cli")


app = typer.Typer(
    name="astraflow",
    help="AstraFlow: dataflow reinforcement learning for LLM agents on Kafka.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
topics_app = typer.Typer(help="Create and converge the topics of topics.yaml.", no_args_is_help=True)
broker_cli.register(app)  # before topics, as `astraflow --help` lists them
app.add_typer(topics_app, name="topics")


# --------------------------------------------------------------------------------------- topics


def _policies_from(policies: str | None, recipe: Path | None) -> list[str] | None:
    if policies:
        return [p.strip() for p in policies.split(",") if p.strip()]
    if recipe is not None:
        from astraflow.config import load_recipe

        return load_recipe(recipe).policy_names
    return None


def _settings_from(recipe: Path | None, bootstrap: str | None) -> KafkaSettings:
    from astraflow.config import load_recipe
    from astraflow.kafka import resolve

    base = load_recipe(recipe).kafka if recipe is not None else KafkaSettings()
    if bootstrap:
        base = base.model_copy(update={"bootstrap": bootstrap})
        os.environ.pop("ASTRAFLOW_BOOTSTRAP", None)
    return resolve(base)


Recipe = Annotated[
    Path | None, typer.Option("--recipe", "-r", help="Recipe YAML (policies, kafka settings).")
]
Bootstrap = Annotated[
    str | None,
    typer.Option(help="Kafka bootstrap servers (default: recipe, ASTRAFLOW_BOOTSTRAP, or the local broker)."),
]


@topics_app.command("apply")
def topics_apply(
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="Topic spec (default: topics.yaml).")
    ] = None,
    policies: Annotated[
        str | None, typer.Option(help="Comma-separated policies for {policy} templates.")
    ] = None,
    recipe: Recipe = None,
    bootstrap: Bootstrap = None,
    profile: Annotated[
        str | None,
        typer.Option(
            help="A profile of topics.yaml laid over every topic, e.g. "
            "`replicated` (default: $ASTRAFLOW_TOPICS_PROFILE)."
        ),
    ] = None,
) -> None:
    """Create missing topics, grow partitions and converge configs. Idempotent."""
    from astraflow import topics
    from astraflow.kafka import make_admin

    try:
        spec = topics.load_spec(file or topics.DEFAULT_SPEC)
        settings = _settings_from(recipe, bootstrap)
        specs = topics.expand(spec, _policies_from(policies, recipe), settings, profile=profile)
        report = topics.apply(make_admin(settings), specs)
    except AstraFlowError as exc:
        raise fail(str(exc)) from None
    table = Table(
        "topic", "partitions", "replicas", "cleanup", "change", title=f"topics on {settings.bootstrap}"
    )
    grown = {n: (a, b) for n, a, b in report.grown}
    reconf = dict(report.reconfigured)
    for s in specs:
        if s.name in report.created:
            change = "created"
        elif s.name in grown:
            change = f"grown {grown[s.name][0]} -> {grown[s.name][1]}"
        elif s.name in reconf:
            change = "configs: " + ", ".join(f"{k}={v}" for k, v in reconf[s.name].items())
        else:
            change = "unchanged"
        table.add_row(s.name, str(s.partitions), str(s.replication), s.configs["cleanup.policy"], change)
    out.print(table)
    for w in report.warnings:
        console.print(f"[yellow]warning:[/] {w}", highlight=False)


@topics_app.command("list")
def topics_list(recipe: Recipe = None, bootstrap: Bootstrap = None) -> None:
    """List the topics of the cluster with their partition counts."""
    from astraflow.kafka import make_admin

    try:
        settings = _settings_from(recipe, bootstrap)
        md = make_admin(settings).list_topics(timeout=15)
    except AstraFlowError as exc:
        raise fail(str(exc)) from None
    for name in sorted(md.topics):
        if not name.startswith("__"):
            out.print(f"{name}\t{len(md.topics[name].partitions)}", highlight=False)


# --------------------------------------------------------------------------------------- compose


@app.command("compose")
def compose(
    recipe: Annotated[
        Path, typer.Option("--recipe", "-r", help="Recipe YAML, under recipes/ (the image holds it).")
    ],
    base: Annotated[Path, typer.Option(help="The compose file to build from.")] = Path("docker-compose.yml"),
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Where to write (default: docker-compose.<recipe name>.yml beside the base).",
        ),
    ] = None,
) -> None:
    """Write a compose file that runs RECIPE: the base's services, one trainer per policy."""
    from astraflow.compose import write_compose
    from astraflow.config import load_recipe

    try:
        target = output or base.parent / f"docker-compose.{load_recipe(recipe).name}.yml"
        config = write_compose(recipe, base, target)
    except (AstraFlowError, OSError) as exc:
        raise fail(str(exc)) from None
    trainers = [n for n in config["services"] if n.startswith("trainer-")]
    console.print(
        f"wrote {target} ({', '.join(trainers)}); run it with: docker compose -f {target} up", highlight=False
    )
    out.print(str(target), highlight=False)


# --------------------------------------------------------------------------------------- components


def _register_components() -> None:
    for module in COMPONENT_CLIS:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module.startswith(exc.name):
                continue  # that component is not installed here
            raise
        mod.register(app)


_register_components()


def main() -> None:
    # A crash in native code called from Python (torch, a C extension) prints every thread's
    # Python stack to stderr, which a supervised component's log and `astraflow run`'s output
    # keep. A crash in one of librdkafka's own threads ends the process without it (seen with
    # librdkafka #5040); the kernel log (`dmesg`) names the thread and library then.
    faulthandler.enable()
    logging.basicConfig(
        level=os.environ.get("ASTRAFLOW_LOG_LEVEL", "WARNING"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from astraflow import gcpause
    from astraflow.runner.supervisor import dump_stacks_on_signal, exit_when_orphaned

    gcpause.pause(sys.argv[1] if len(sys.argv) > 1 else None)  # until the component is built
    dump_stacks_on_signal()
    exit_when_orphaned()
    try:
        app()
    except AstraFlowError as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(1)


if __name__ == "__main__":
    main()
