"""`astraflow status`: the dashboard of a running system, printed once, from any shell."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.panel import Panel

from astraflow import broker
from astraflow.broker import secure
from astraflow.config import KafkaSettings, load_recipe
from astraflow.errors import ConfigError
from astraflow.kafka import resolve
from astraflow.runner.advice import DEFAULT_MAX_EPISODES, advise, measure, rows_from_history
from astraflow.runner.collector import MetricsCollector, Snapshot
from astraflow.runner.dashboard import render
from astraflow.runner.plan import run_dir_of
from astraflow.topics import METRICS


def show_status(
    recipe_path: Path | None, bootstrap: str | None, run_dir: Path | None, since: float, wait: float
) -> int:
    recipe = load_recipe(recipe_path) if recipe_path else None
    base = recipe.kafka if recipe else KafkaSettings()
    rd = run_dir_of(recipe, run_dir) if recipe is not None else run_dir
    if bootstrap:
        base = base.model_copy(update={"bootstrap": bootstrap})
    elif rd is not None:
        found = broker.local_bootstrap(rd / "broker")
        if found and not KafkaSettings.from_env(base).bootstrap:
            base = base.model_copy(update={"bootstrap": found})
            state = broker.BrokerState.load(rd / "broker")
            if state is not None and state.secure:  # `run --secure`: read as its admin principal
                base = KafkaSettings.from_env(
                    base, environ=secure.credentials(rd / "broker", "admin").env(found)
                )
    settings = resolve(base)
    if recipe is not None and settings.namespace is None and (bootstrap or recipe.kafka.bootstrap):
        settings = settings.model_copy(update={"namespace": recipe.name})
    collector = MetricsCollector(
        settings,
        since_s=since,
        streams_group=recipe.streams.app_id if recipe else None,
        worker_group=recipe.worker.group if recipe else "workers",
    ).start()
    time.sleep(wait)
    collector.stop()
    snap = collector.snapshot()
    policies = (
        recipe.policy_names
        if recipe
        else sorted({i.id.split(".", 1)[1] for i in snap.of("trainer") if "." in i.id} | set(snap.weights))
    )
    max_episodes = recipe.worker.max_episodes if recipe else DEFAULT_MAX_EPISODES
    Console().print(
        status_panel(
            snap, collector.history(), policies, f"astraflow status ({settings.bootstrap})", max_episodes
        )
    )
    if snap.metrics_seen == 0:
        raise ConfigError(
            f"no metrics in the last {since:.0f}s on {settings.topic(METRICS)}: is a run going?"
        )
    return 0


def status_panel(
    snap: Snapshot,
    history: dict[tuple[str, str], list[tuple[int, float, dict[str, float]]]],
    policies: list[str],
    title: str,
    max_episodes: int = DEFAULT_MAX_EPISODES,
) -> Panel:
    """The dashboard with the scaling advice measured over every metric read (the last `--since` seconds)."""
    advice = advise(measure(rows_from_history(history), max_episodes=max_episodes))
    return render(snap, policies, title, advice=advice.line)
