"""Scaling advice: what bounds a run, from the waits and lags its components report, in one sentence.

The paper's balance report tells operators what to scale. Here `measure` turns metric rows (the
records of `metrics.jsonl`, or the collector's history) into a few fractions and rates over a time
window, and `advise` classifies them; both are pure, so each regime has golden tests.

What is measured (each from cumulative counters, so a missed report loses nothing; each over its
instance's latest process, from its last report before the window):
- trainer wait: share of the window a policy's trainer had no complete batch to train (the trainer's
  `wait_s`; in older metrics without it, the window minus its steps' compute time, batch.tokens /
  tokens_per_s per step, which also counts checkpoint and publication time as waiting);
- feeder blocked: share of the window admission control held the feeder back (`feeder.blocked_s`);
- workers idle: 1 - episodes in flight / `max_episodes`, from `worker.episode_s` (episodes x seconds
  in flight; older metrics: the `worker.in_flight` samples); a worker takes tasks while it has room,
  so room left means no task was waiting for it;
- trajectories backlog growth: records/s by which the streams' consumer lag on `trajectories` grows,
  from the collector's lag samples, or else what the workers wrote minus what streams read, over
  the span in which all of them reported.

The regimes, with the busiest trainer (the least waiting; admission follows the slowest trainer):
- trainer waits little: workers mostly idle -> trainer-bound; otherwise balanced;
- trainer waits: trajectories backlog grows -> streams-bound; workers busy -> rollout-bound, with
  the workers that would fill the trainer's idle time; workers idle and feeder held back ->
  admission-bound (the staleness window holds too few groups for the pipeline's latency); workers
  idle and the feeder free -> feeder-bound (the task source itself is the limit).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from astraflow.topics import TRAJECTORIES

TRAINER_BUSY_BELOW = 0.25  # a trainer waiting less than this share of the time bounds the run
WORKERS_IDLE_FROM = 0.5  # workers with at least this much room are short of tasks
FEEDER_BLOCKED_FROM = 0.5  # a feeder held back at least this share of the time is limited by admission
BACKLOG_GROWS_FROM = 0.1  # trajectories backlog growing by this share of the workers' output is a bottleneck
BACKLOG_MIN_RECORDS = 32  # and by at least this many records over the window
MIN_COMMON_SPAN_S = 20.0  # backlog growth from rates needs workers and streams reporting this long together
MIN_TRAINER_SPAN_S = 10.0  # a trainer measured over less (a few steps after a restart) says nothing yet
MAX_WAIT_FOR_ESTIMATE = 0.9  # above it the worker estimate is a lower bound ("at least N")
DEFAULT_MAX_EPISODES = 16  # WorkerConfig.max_episodes, for workers that do not report theirs


@dataclass(frozen=True)
class Observed:
    """What `advise` reads, measured over `window_s` seconds. None: not measured."""

    window_s: float
    trainer_wait: dict[str, float] = field(default_factory=dict)  # policy -> share of time waiting for data
    trainer_steps_per_s: dict[str, float] = field(default_factory=dict)
    wait_source: str = "wait_s"  # or "step times" (an upper bound: counts publication as waiting)
    workers: int = 0
    workers_idle: float | None = None
    feeder_blocked: float | None = None
    backlog_growth_per_s: float | None = None  # trajectories not yet read by streams, change per second
    trajectories_per_s: float | None = None  # what the workers write
    lag: dict[str, float] = field(default_factory=dict)  # latest consumer lag per stage


@dataclass(frozen=True)
class Advice:
    regime: (
        str  # trainer-bound, rollout-bound, streams-bound, admission-bound, feeder-bound, balanced, unknown
    )
    line: str  # the sentence status and the summary print; starts with the regime
    more_workers: int | None = None  # rollout-bound: about how many more workers would fill the trainer

    def as_dict(self) -> dict[str, Any]:
        return {"regime": self.regime, "line": self.line, "more_workers": self.more_workers}


def advise(obs: Observed) -> Advice:
    """Classify what bounds the run; see the module docstring."""
    if not obs.trainer_wait:
        return Advice(
            "unknown",
            f"unknown: no trainer has reported steps over {MIN_TRAINER_SPAN_S:.0f} s in the "
            "window (in its latest process): too little to tell what bounds the run",
        )
    policy, wait = min(obs.trainer_wait.items(), key=lambda kv: kv[1])
    who = f"trainer {policy}" if len(obs.trainer_wait) > 1 else "the trainer"
    idle, blocked = obs.workers_idle, obs.feeder_blocked
    waited = f"{who} waited {wait:.0%}" + (" (from step times)" if obs.wait_source != "wait_s" else "")
    if wait < TRAINER_BUSY_BELOW:
        if idle is not None and idle >= WORKERS_IDLE_FROM:
            return Advice(
                "trainer-bound",
                f"trainer-bound: workers idle {idle:.0%}; {waited}"
                + _blocked(blocked)
                + ". A faster trainer (GPU, more DDP ranks) speeds the run; "
                "more workers would not",
            )
        return Advice(
            "balanced", f"balanced: {waited}, workers idle {_pct(idle)}; scale trainers and workers together"
        )
    growth, made = obs.backlog_growth_per_s, obs.trajectories_per_s
    if (
        growth is not None
        and growth * obs.window_s >= BACKLOG_MIN_RECORDS
        and (made is None or growth >= BACKLOG_GROWS_FROM * made)
    ):
        now = f" (now {obs.lag[TRAJECTORIES]:.0f})" if TRAJECTORIES in obs.lag else ""
        return Advice(
            "streams-bound",
            f"streams-bound: the trajectories lag grows by {growth:.1f} records/s"
            f"{now} while {waited}; run more streams "
            "instances (up to the partitions of trajectories) or lighten its stages",
        )
    if obs.workers == 0:
        return Advice("rollout-bound", f"rollout-bound: no worker reported while {waited}; start workers")
    if idle is not None and idle < WORKERS_IDLE_FROM:
        more, at_least = more_workers(obs.workers, wait)
        return Advice(
            "rollout-bound",
            f"rollout-bound: {'at least' if at_least else 'about'} {more} more "
            f"worker{'s' if more != 1 else ''} would keep the trainer busy ({waited}, "
            f"{obs.workers} workers idle {idle:.0%})",
            more,
        )
    if blocked is None:
        return Advice(
            "unknown",
            f"unknown: {waited} and workers idle {_pct(idle)}, but the feeder has not "
            "reported twice: admission or the task source limits the run",
        )
    if blocked >= FEEDER_BLOCKED_FROM:
        return Advice(
            "admission-bound",
            f"admission-bound: {waited} and workers idle {_pct(idle)} while the "
            f"feeder was held back {blocked:.0%}: the staleness window holds too few groups for "
            "the pipeline's latency; raise feeder.ahead_groups where set, else max_staleness or "
            "trainer.publish_every",
        )
    return Advice(
        "feeder-bound",
        f"feeder-bound: {waited} and workers idle {_pct(idle)} while the feeder "
        f"was held back {blocked:.0%}: the task source is the limit (max_tasks reached, the "
        "JSONL ended, or selective rollout skips most tasks)",
    )


def more_workers(workers: int, wait: float) -> tuple[int, bool]:
    """Workers to add so that the trainer never waits. The trainer's step rate is what the workers
    deliver; busy for a share 1 - wait of the time, it could step 1 / (1 - wait) times as fast.
    The workers deliver in proportion to their number, so `workers / (1 - wait)` of them would keep
    up (assuming the broker and streams keep up too). Returns (more, whether only a lower bound)."""
    capped = min(wait, MAX_WAIT_FOR_ESTIMATE)
    needed = math.ceil(workers / (1.0 - capped) - 1e-9)
    return max(1, needed - workers), wait > MAX_WAIT_FOR_ESTIMATE


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.0%}"


def _blocked(blocked: float | None) -> str:
    return "" if blocked is None else f", the feeder held back {blocked:.0%}"


# ------------------------------------------------------------------------------ measuring


def rows_from_history(
    history: dict[tuple[str, str], list[tuple[int, float, dict[str, float]]]],
) -> list[dict[str, Any]]:
    """The collector's history as metrics.jsonl rows."""
    return [
        {"component": c, "id": i, "time": t, "step": s, "values": v}
        for (c, i), points in history.items()
        for s, t, v in points
    ]


def counter(rs: list[dict[str, Any]], key: str, start: float) -> list[tuple[float, float]]:
    """(time, value) of one instance's cumulative counter, for a window from `start`: from the last
    report at or before `start` on (the baseline of what grew in the window; a trainer that waited
    long reports the wait only with its next step), and of its latest process only (a counter that
    went down was restarted; the time between two processes is neither work nor waiting)."""
    points = [(r["time"], float(r["values"][key])) for r in rs if key in r["values"]]
    restart = max((i for i in range(1, len(points)) if points[i][1] < points[i - 1][1]), default=0)
    points = points[restart:]
    baseline = max((i for i, (t, _) in enumerate(points) if t <= start), default=0)
    return points[baseline:]


def measure(
    rows: list[dict[str, Any]],
    window_s: float | None = None,
    max_episodes: int = DEFAULT_MAX_EPISODES,
    end: float | None = None,
) -> Observed:
    """Measure the `window_s` seconds (default: from the first row) that end at `end` (default: the
    last row), from the first trainer step on. A finished run ends at its trainers' last step:
    what comes later is shutdown."""
    if not rows:
        return Observed(window_s=0.0)
    end = max(r["time"] for r in rows) if end is None else end
    start = end - window_s if window_s is not None else min(r["time"] for r in rows)
    # before the first trainer step the run is starting (models loading, workers joining): the
    # feeder is held back and workers idle whatever will bound the run later
    first_step = min(
        (r["time"] for r in rows if r["component"] == "trainer" and r["step"] >= 0), default=start
    )
    start = max(start, first_step)
    every: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: r["time"]):
        if r["time"] <= end:
            every[(r["component"], r["id"])].append(r)
    # instances that reported in the window, with their earlier reports (the counters' baselines)
    series = {k: rs for k, rs in every.items() if rs[-1]["time"] >= start}
    waits, rates, sources = {}, {}, set()
    for (component, rid), rs in series.items():
        measured = (
            _trainer_wait([r for r in rs if r["step"] >= 0], start, end) if component == "trainer" else None
        )
        if measured is None:
            continue
        policy = rid.split(".", 1)[1] if "." in rid else rid
        waits[policy], rates[policy], source = measured
        sources.add(source)
    workers = [rs for (c, _), rs in series.items() if c == "worker"]
    idle = [i for i in (_worker_idle(rs, start, max_episodes) for rs in workers) if i is not None]
    blocked = [
        _per_s(counter(rs, "feeder.blocked_s", start)) for (c, _), rs in series.items() if c == "feeder"
    ]
    made_rates = [
        r for r in (_per_s(counter(rs, "worker.trajectories", start)) for rs in workers) if r is not None
    ]
    made = sum(made_rates) if made_rates else None
    lag_rows = [r for r in series.get(("collector", "lag"), []) if r["time"] >= start]
    lag = {k.removeprefix("lag."): v for k, v in lag_rows[-1]["values"].items()} if lag_rows else {}
    growth = None
    backlog = [r for r in lag_rows if "lag.trajectories" in r["values"]]
    if len(backlog) >= 2 and backlog[-1]["time"] > backlog[0]["time"]:
        growth = (backlog[-1]["values"]["lag.trajectories"] - backlog[0]["values"]["lag.trajectories"]) / (
            backlog[-1]["time"] - backlog[0]["time"]
        )
    if growth is None:
        growth = _backlog_growth(
            [counter(rs, "worker.trajectories", start) for rs in workers],
            [counter(rs, "trajectories.in", start) for (c, _), rs in series.items() if c == "streams"],
        )
    return Observed(
        window_s=end - start,
        trainer_wait=waits,
        trainer_steps_per_s=rates,
        wait_source="wait_s" if sources <= {"wait_s"} else "step times",
        workers=len(workers),
        workers_idle=sum(idle) / len(idle) if idle else None,
        feeder_blocked=max((min(1.0, max(0.0, b)) for b in blocked if b is not None), default=None),
        backlog_growth_per_s=growth,
        trajectories_per_s=made,
        lag=lag,
    )


def _trainer_wait(steps: list[dict[str, Any]], start: float, end: float) -> tuple[float, float, str] | None:
    """(share of the time waited, steps/s, source) from the trainer's baseline report to `end`;
    None under two reports or over less than MIN_TRAINER_SPAN_S. After its last report it was
    either in its next step or waiting: the tail beyond one step time counts as waiting."""
    recent = [r for r in steps if r["time"] >= start] or steps
    busy_per_step = [
        r["values"]["batch.tokens"] / r["values"]["tokens_per_s"]
        for r in recent
        if r["values"].get("tokens_per_s", 0) > 0 and "batch.tokens" in r["values"]
    ]
    step_s = sum(busy_per_step) / len(busy_per_step) if busy_per_step else 0.0
    waits = counter(steps, "wait_s", start)
    if len(waits) >= 2 and all("wait_s" in r["values"] for r in recent):
        first_t, last_t = waits[0][0], waits[-1][0]
        in_steps = [r for r in steps if first_t <= r["time"] <= last_t]
        waited, source = waits[-1][1] - waits[0][1], "wait_s"
    else:
        baseline = max((i for i, r in enumerate(steps) if r["time"] <= start), default=0)
        in_steps = steps[baseline:]
        if len(in_steps) < 2:
            return None
        first_t, last_t = in_steps[0]["time"], in_steps[-1]["time"]
        waited, source = (
            (last_t - first_t) - (in_steps[-1]["step"] - in_steps[0]["step"]) * step_s,
            "step times",
        )
    span = end - first_t
    if span < MIN_TRAINER_SPAN_S or last_t <= first_t:
        return None
    waited += max(0.0, end - last_t - step_s)
    rate = (in_steps[-1]["step"] - in_steps[0]["step"]) / (last_t - first_t)
    return min(1.0, max(0.0, waited / span)), rate, source


def _per_s(points: list[tuple[float, float]]) -> float | None:
    """Per-second growth of a counter's (time, value) points (None: under two)."""
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])


def _worker_idle(rs: list[dict[str, Any]], start: float, max_episodes: int) -> float | None:
    """1 - occupancy of a worker's episode slots: from `worker.episode_s` (episodes x seconds in
    flight) where reported, else the mean of the in-flight samples, which see one moment each."""
    limit = next(
        (r["values"]["worker.max_episodes"] for r in reversed(rs) if "worker.max_episodes" in r["values"]),
        float(max_episodes),
    )
    busy = _per_s(counter(rs, "worker.episode_s", start))
    if busy is not None:
        return 1.0 - min(1.0, busy / limit)
    samples = [
        min(1.0, r["values"]["worker.in_flight"] / limit)
        for r in rs
        if r["time"] >= start and "worker.in_flight" in r["values"]
    ]
    return 1.0 - sum(samples) / len(samples) if samples else None


def _at(points: list[tuple[float, float]], t: float) -> float:
    """A counter at time t inside its span, linearly between reports."""
    for (t0, v0), (t1, v1) in zip(points, points[1:], strict=False):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return points[-1][1]


def _backlog_growth(
    made: list[list[tuple[float, float]]], taken: list[list[tuple[float, float]]]
) -> float | None:
    """Records/s by which what producers wrote outgrows what consumers read, over the span every
    one of them reported in (comparing rates over different spans mistakes start-up for a backlog)."""
    made, taken = [m for m in made if len(m) >= 2], [t for t in taken if len(t) >= 2]
    if not made or not taken:
        return None
    a, b = max(s[0][0] for s in made + taken), min(s[-1][0] for s in made + taken)
    if b - a < MIN_COMMON_SPAN_S:
        return None
    grown = sum(_at(s, b) - _at(s, a) for s in made) - sum(_at(s, b) - _at(s, a) for s in taken)
    return grown / (b - a)
