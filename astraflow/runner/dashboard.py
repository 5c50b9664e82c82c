"""The live terminal dashboard (rich), built from a collector Snapshot.

Per policy: reward, success rate, trainer step and weight version, tokens/s, staleness.
Per worker (and region): tokens/s, episodes, weight version. Per stage: consumer lag.
Plus streams counters, dead letters, the scaling advice (advice.py: what bounds the run) and, in
red, a stalled trainer with the stage that holds it back (stall.py).
`astraflow status` renders the same thing once.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from astraflow.runner.collector import Snapshot
from astraflow.topics import TASKS, TRAJECTORIES


def _f(value: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if value is None else fmt.format(value)


def _age(t: float) -> str:
    s = max(0.0, time.time() - t)
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago"


def policies_table(snap: Snapshot, policies: list[str]) -> Table:
    table = Table(title="policies", expand=True)
    for col in (
        "policy",
        "step",
        "version",
        "reward",
        "success",
        "loss",
        "tokens/s",
        "staleness",
        "stale dropped",
        "updated",
    ):
        table.add_column(col, justify="right" if col != "policy" else "left")
    trainers = {i.id: i for i in snap.of("trainer")}
    for p in policies:
        t = trainers.get(f"trainer.{p}")
        v = t.values if t else {}
        wv = snap.weights.get(p)
        table.add_row(
            p,
            _f(v.get("step"), "{:.0f}"),
            str(wv.version) if wv else _f(v.get("version"), "{:.0f}"),
            _f(v.get("reward.mean")),
            _f(v.get("reward.success"), "{:.0%}"),
            _f(v.get("loss"), "{:.4f}"),
            _f(v.get("tokens_per_s"), "{:.0f}"),
            _f(v.get("staleness.mean"), "{:.2f}"),
            _f(v.get("samples.stale"), "{:.0f}"),
            _age(t.time) if t else "-",
        )
    return table


def workers_table(snap: Snapshot, policies: list[str]) -> Table:
    table = Table(title="workers", expand=True)
    for col in (
        "worker",
        "region",
        "tokens/s",
        "episodes",
        "in flight",
        "tasks done",
        *(f"v[{p}]" for p in policies),
        "updated",
    ):
        table.add_column(col, justify="left" if col in ("worker", "region") else "right")
    for w in snap.of("worker"):
        v = w.values
        table.add_row(
            w.id,
            w.region,
            _f(v.get("worker.tokens_per_s"), "{:.0f}"),
            _f(v.get("worker.episodes"), "{:.0f}"),
            _f(v.get("worker.in_flight"), "{:.0f}"),
            _f(v.get("worker.tasks_done"), "{:.0f}"),
            *(_f(v.get(f"worker.weight_version.{p}"), "{:.0f}") for p in policies),
            _age(w.time),
        )
    return table


def flow_table(snap: Snapshot) -> Table:
    table = Table(title="dataflow", expand=True)
    for col in (
        "feeder published",
        "ahead of trainers",
        "tasks lag",
        "trajectories lag",
        "trajectories in",
        "out",
        "dropped",
        "pending",
        "dead letters",
    ):
        table.add_column(col, justify="right")
    feeder = snap.of("feeder")
    fv = feeder[0].values if feeder else {}
    streams = [s.values for s in snap.of("streams")]
    s_in = sum(v.get("trajectories.in", 0) for v in streams)
    s_out = sum(v.get("trajectories.out", 0) for v in streams)
    dropped = sum(val for v in streams for k, val in v.items() if k.startswith("trajectories.dropped."))
    pending = sum(v.get("trajectories.pending", 0) for v in streams)
    table.add_row(
        _f(fv.get("feeder.published"), "{:.0f}"),
        _f(fv.get("feeder.ahead"), "{:.0f}"),
        str(snap.lag.get(TASKS, "-")),
        str(snap.lag.get(TRAJECTORIES, "-")),
        f"{s_in:.0f}",
        f"{s_out:.0f}",
        f"{dropped:.0f}",
        f"{pending:.0f}",
        str(snap.deadletters),
    )
    return table


def render(
    snap: Snapshot,
    policies: list[str],
    title: str,
    events: list[str] | None = None,
    advice: str | None = None,
    stall: str | None = None,
) -> Panel:
    parts: list[Any] = [policies_table(snap, policies), workers_table(snap, policies), flow_table(snap)]
    if stall:  # astraflow/runner/stall.py: a trainer made no progress for many step times
        parts.append(Text(stall, style="bold red"))
    if advice:
        parts.append(Text(f"scaling: {advice}", style="bold"))
    if events:
        parts.append(Text("\n".join(events[-6:]), style="dim"))
    elapsed = time.time() - snap.started
    return Panel(
        Group(*parts), title=f"{title}  ({elapsed / 60:.1f} min, {snap.metrics_seen} metric records)"
    )
