"""The live terminal dashboard (rich), built from a collector Snapshot.

Per policy: reward, success rate, trainer step and weight version, tokens/s, staleness.
Per worker (and region): tokens/s, episodes, weight version. Per stage: consumer lag.
Plus streams counters, dead letters, the scaling advice (advice.py: what bounds the run) and, in
red, a stalled trainer with the stage that holds it back (stall.py).
`astraflow status` renders the same thing once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
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


def _table(title: str, columns: Iterable[str], left: tuple[str, ...] = ()) -> Table:
    """A full-width table whose columns are right-aligned numbers, except the `left` ones."""
    table = Table(title=title, expand=True)
    for col in columns:
        table.add_column(col, justify="left" if col in left else "right")
    return table


#: the trainer metrics the policies table shows after step and version: (heading, metric, format)
TRAINER_METRICS = (
    ("reward", "reward.mean", "{:.3f}"),
    ("success", "reward.success", "{:.0%}"),
    ("loss", "loss", "{:.4f}"),
    ("tokens/s", "tokens_per_s", "{:.0f}"),
    ("staleness", "staleness.mean", "{:.2f}"),
    ("stale dropped", "samples.stale", "{:.0f}"),
)
#: the worker counters the workers table shows after worker and region: (heading, metric)
WORKER_COUNTERS = (
    ("tokens/s", "worker.tokens_per_s"),
    ("episodes", "worker.episodes"),
    ("in flight", "worker.in_flight"),
    ("tasks done", "worker.tasks_done"),
)


def policies_table(snap: Snapshot, policies: list[str]) -> Table:
    headings = ("policy", "step", "version", *(h for h, _, _ in TRAINER_METRICS), "updated")
    table = _table("policies", headings, left=("policy",))
    trainers = {i.id: i for i in snap.of("trainer")}
    for p in policies:
        t = trainers.get(f"trainer.{p}")
        v = t.values if t else {}
        wv = snap.weights.get(p)
        table.add_row(
            p,
            _f(v.get("step"), "{:.0f}"),
            str(wv.version) if wv else _f(v.get("version"), "{:.0f}"),
            *(_f(v.get(metric), fmt) for _, metric, fmt in TRAINER_METRICS),
            _age(t.time) if t else "-",
        )
    return table


def workers_table(snap: Snapshot, policies: list[str]) -> Table:
    versions = [f"v[{p}]" for p in policies]
    headings = ("worker", "region", *(h for h, _ in WORKER_COUNTERS), *versions, "updated")
    table = _table("workers", headings, left=("worker", "region"))
    for w in snap.of("worker"):
        v = w.values
        table.add_row(
            w.id,
            w.region,
            *(_f(v.get(metric), "{:.0f}") for _, metric in WORKER_COUNTERS),
            *(_f(v.get(f"worker.weight_version.{p}"), "{:.0f}") for p in policies),
            _age(w.time),
        )
    return table


def flow_table(snap: Snapshot) -> Table:
    table = _table(
        "dataflow",
        (
            "feeder published",
            "ahead of trainers",
            "tasks lag",
            "trajectories lag",
            "trajectories in",
            "out",
            "dropped",
            "pending",
            "dead letters",
        ),
    )
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
