"""`astraflow status`: the dashboard of a running system, printed once, from any shell."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from astraflow import broker
from astraflow.config import KafkaSettings, load_recipe
from astraflow.errors import ConfigError
from astraflow.kafka import resolve
from astraflow.runner.collector import Collector
from astraflow.runner.dashboard import render
from astraflow.runner.run import run_dir_of


def show_status(recipe_path: Path | None, bootstrap: str | None, run_dir: Path | None, since: float,
                wait: float) -> int:
    recipe = load_recipe(recipe_path) if recipe_path else None
    base = recipe.kafka if recipe else KafkaSettings()
    if bootstrap:
        base = base.model_copy(update={"bootstrap": bootstrap})
    elif recipe is not None or run_dir is not None:
        rd = run_dir or run_dir_of(recipe)  # type: ignore[arg-type]
        found = broker.local_bootstrap(rd / "broker")
        if found and not KafkaSettings.from_env(base).bootstrap:
            base = base.model_copy(update={"bootstrap": found})
    settings = resolve(base)
    if recipe is not None and settings.namespace is None and (bootstrap or recipe.kafka.bootstrap):
        settings = settings.model_copy(update={"namespace": recipe.name})
    collector = Collector(settings, since_s=since,
                          streams_group=recipe.streams.app_id if recipe else None,
                          worker_group=recipe.worker.group if recipe else "workers").start()
    time.sleep(wait)
    collector.stop()
    snap = collector.snapshot()
    policies = recipe.policy_names if recipe else sorted(
        {i.id.split(".", 1)[1] for i in snap.of("trainer") if "." in i.id} | set(snap.weights))
    Console().print(render(snap, policies, f"astraflow status ({settings.bootstrap})"))
    if snap.metrics_seen == 0:
        raise ConfigError(f"no metrics in the last {since:.0f}s on {settings.topic('metrics')}: is a run going?")
    return 0
