"""The run report: from `<run_dir>/metrics.jsonl` to TensorBoard event files, PNG plots and a short
summary (JSON and text), which ends with the scaling advice (what bounded the run, advice.py).

The learning statistic used throughout (summary, end-to-end tests): per-step mean rewards of the
first and last tenth of a policy's trainer steps, compared with a one-sided permutation test
(10,000 permutations of the pooled step means; p = share of permutations whose last-minus-first
difference is at least the observed one). It assumes nothing about the reward distribution.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from astraflow.runner.advice import DEFAULT_MAX_EPISODES, advise, measure

PERMUTATIONS = 10_000
MIN_SUMMARY_WINDOW_S = 30.0


def load_metrics(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if not path.exists():
        return rows
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line cut by a crash
    return rows


def trainer_series(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, float]]]:
    """Per policy, the trainer's per-step values in step order (last report of a step wins)."""
    by_policy: dict[str, dict[int, dict[str, float]]] = defaultdict(dict)
    for r in rows:
        if r["component"] != "trainer" or r["step"] < 0:
            continue
        policy = r["id"].split(".", 1)[1] if "." in r["id"] else r["id"]
        by_policy[policy][r["step"]] = {**r["values"], "step": float(r["step"]), "time": r["time"]}
    return {p: [steps[s] for s in sorted(steps)] for p, steps in by_policy.items()}


def permutation_p_value(
    first: list[float], last: list[float], rounds: int = PERMUTATIONS, seed: int = 0
) -> float:
    """One-sided p-value that mean(last) - mean(first) is this large by chance. The permutations are
    one matrix (rounds x pooled values, shuffled row by row): 10,000 of 200 values take ~0.05 s,
    where a Python loop took 0.7 s, twice per policy at the end of every run."""
    if not first or not last:
        return 1.0
    import numpy as np

    observed = sum(last) / len(last) - sum(first) / len(first)
    pooled = np.tile(np.asarray(first + last, dtype=np.float64), (rounds, 1))
    shuffled = np.random.default_rng(seed).permuted(pooled, axis=1)
    a, b = shuffled[:, : len(first)].mean(axis=1), shuffled[:, len(first) :].mean(axis=1)
    hits = int(np.count_nonzero(b - a >= observed - 1e-12))
    return (hits + 1) / (rounds + 1)


def learning(series: list[dict[str, float]], key: str = "reward.mean") -> dict[str, float]:
    values = [s[key] for s in series if key in s and math.isfinite(s[key])]
    if len(values) < 10:
        return {"steps": float(len(values))}
    tenth = max(1, len(values) // 10)
    first, last = values[:tenth], values[-tenth:]
    windows = [sum(values[i : i + tenth]) / tenth for i in range(len(values) - tenth + 1)]
    return {
        "steps": float(len(values)),
        "first_tenth": sum(first) / len(first),
        "last_tenth": sum(last) / len(last),
        "best_tenth": max(windows),  # the best run of a tenth of the steps: what the run reached
        "improvement": sum(last) / len(last) - sum(first) / len(first),
        "p_value": permutation_p_value(first, last),
    }


def write_tensorboard(rows: list[dict[str, Any]], out_dir: Path) -> None:
    """One TensorBoard event file per component instance, a scalar per metric value. Written with
    tensorboard's own event writer: torch's SummaryWriter, which wraps it, imports torch (2 s of
    every run's end, in a process that needs torch for nothing else)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writers: dict[str, Any] = {}
    try:
        t0 = min((r["time"] for r in rows), default=0.0)
        for r in rows:
            name = f"{r['component']}/{r['id']}"
            w = writers.get(name)
            if w is None:
                w = writers[name] = EventFileWriter(str(out_dir / r["component"] / r["id"]))
            step = r["step"] if r["step"] >= 0 else int(r["time"] - t0)
            values = [Summary.Value(tag=k, simple_value=float(v)) for k, v in r["values"].items()]
            w.add_event(Event(wall_time=r["time"], step=int(step), summary=Summary(value=values)))
    finally:
        for w in writers.values():
            w.close()


def preload() -> None:
    """Import what the report draws and writes with (~0.6 s of CPU): `astraflow run` does it in a
    thread while its components stop, when the CPU is idle, instead of after them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import tensorboard.summary.writer.event_file_writer  # noqa: F401


def write_plots(rows: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    preload()  # the Agg backend before pyplot
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    series = trainer_series(rows)
    written = []

    def save(fig: Any, name: str) -> None:
        path = out_dir / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for policy, s in series.items():
        steps = [x["step"] for x in s]
        axes[0].plot(steps, [x.get("reward.mean", math.nan) for x in s], label=policy)
        axes[1].plot(steps, [x.get("reward.success", math.nan) for x in s], label=policy)
    axes[0].set(title="reward (batch mean)", xlabel="trainer step")
    axes[1].set(title="success rate", xlabel="trainer step", ylim=(-0.02, 1.02))
    for ax in axes:
        ax.legend() if series else None
        ax.grid(alpha=0.3)
    save(fig, "reward.png")

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    t0 = min((r["time"] for r in rows), default=0.0)
    by_worker: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        if r["component"] == "worker" and "worker.tokens_per_s" in r["values"]:
            by_worker[r["id"]].append(((r["time"] - t0) / 60, r["values"]["worker.tokens_per_s"]))
    for wid, pts in sorted(by_worker.items()):
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], label=wid)
    axes[0].set(title="rollout tokens/s per worker", xlabel="minutes")
    for policy, s in series.items():
        axes[1].plot([x["step"] for x in s], [x.get("tokens_per_s", math.nan) for x in s], label=policy)
    axes[1].set(title="trainer tokens/s", xlabel="trainer step")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    save(fig, "throughput.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, s in series.items():
        ax.plot([x["step"] for x in s], [x.get("staleness.mean", math.nan) for x in s], label=policy)
    ax.set(title="staleness (mean version lag of trained samples)", xlabel="trainer step")
    ax.grid(alpha=0.3)
    if series:
        ax.legend()
    save(fig, "staleness.png")
    return written


def scaling(rows: list[dict[str, Any]], max_episodes: int = DEFAULT_MAX_EPISODES) -> dict[str, Any]:
    """What bounded the run (advice.py), measured over the second half of the trainers' steps
    (at least the last 30 s: the feeder and workers report every 5 s): the first half holds the
    warm-up (models loading, the first weights reaching the workers)."""
    times = [r["time"] for r in rows if r["component"] == "trainer" and r["step"] >= 0]
    window = max((max(times) - min(times)) / 2, MIN_SUMMARY_WINDOW_S) if times else None
    obs = measure(rows, window_s=window, max_episodes=max_episodes, end=max(times) if times else None)
    return {
        **advise(obs).as_dict(),
        "window_s": round(obs.window_s, 1),
        "trainer_wait": obs.trainer_wait,
        "trainer_steps_per_s": obs.trainer_steps_per_s,
        "wait_source": obs.wait_source,
        "workers_idle": obs.workers_idle,
        "feeder_blocked": obs.feeder_blocked,
        "backlog_growth_per_s": obs.backlog_growth_per_s,
    }


def summarize(
    rows: list[dict[str, Any]], extra: dict[str, Any] | None = None, max_episodes: int = DEFAULT_MAX_EPISODES
) -> dict[str, Any]:
    series = trainer_series(rows)
    summary: dict[str, Any] = {"policies": {}, **(extra or {})}
    for policy, s in series.items():
        last = s[-1] if s else {}
        summary["policies"][policy] = {
            "steps": int(last.get("step", 0)),
            "version": int(last.get("version", 0)),
            "reward": learning(s, "reward.mean"),
            "success": learning(s, "reward.success"),
            "final_success": last.get("reward.success"),
            "groups_trained": last.get("groups.trained"),
            "stale_dropped": last.get("samples.stale"),
        }
    workers = {r["id"] for r in rows if r["component"] == "worker"}
    summary["workers"] = sorted(workers)
    summary["metric_records"] = len(rows)
    summary["scaling"] = scaling(rows, max_episodes)
    return summary


def summary_text(summary: dict[str, Any]) -> str:
    lines = [
        f"run: {summary.get('recipe', '?')}  wall time {summary.get('wall_minutes', 0):.1f} min  "
        f"stopped because: {summary.get('stop_reason', '?')}"
    ]
    for policy, p in summary["policies"].items():
        r, s = p["reward"], p["success"]
        lines.append(f"policy {policy}: {p['steps']} steps, weight version {p['version']}")
        if w := p.get("warmup"):
            lines.append(
                f"  warm-up {w['warmup.steps']:.0f} supervised steps on demonstrations, loss "
                f"{w['warmup.loss_first']:.3f} -> {w['warmup.loss_last']:.3f} ({w['warmup.seconds']:.0f} s)"
            )
        if "first_tenth" in r:
            lines.append(
                f"  reward  first tenth {r['first_tenth']:.3f} -> last tenth {r['last_tenth']:.3f} "
                f"(one-sided permutation p = {r['p_value']:.4f})"
            )
        if "first_tenth" in s:
            lines.append(
                f"  success first tenth {s['first_tenth']:.1%} -> last tenth {s['last_tenth']:.1%} "
                f"(best tenth {s['best_tenth']:.1%})"
            )
    lines.append(
        f"workers: {len(summary['workers'])}; dead letters: {summary.get('deadletters', 0)}; "
        f"restarts: {summary.get('restarts', {})}"
    )
    if "scaling" in summary:
        lines.append(f"scaling: {summary['scaling']['line']}")
    return "\n".join(lines)


def write_report(
    run_dir: Path, extra: dict[str, Any] | None = None, max_episodes: int = DEFAULT_MAX_EPISODES
) -> dict[str, Any]:
    """Write tensorboard/, plots/*.png, summary.json and summary.txt under `run_dir`."""
    rows = load_metrics(run_dir / "metrics.jsonl")
    write_tensorboard(rows, run_dir / "tensorboard")
    write_plots(rows, run_dir / "plots")
    summary = summarize(rows, extra, max_episodes)
    for policy, p in summary["policies"].items():  # the trainer's supervised warm-up, if it ran one
        warm = run_dir / "trainer" / policy / "warmup.json"
        if warm.exists():
            p["warmup"] = json.loads(warm.read_text())
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    (run_dir / "summary.txt").write_text(summary_text(summary) + "\n")
    return summary
