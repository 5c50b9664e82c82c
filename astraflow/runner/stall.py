"""The stall detector of `astraflow run`: a hang is never silent.

A trainer that makes no progress for `factor` times its median step interval (and at least
`min_s`; `first_step_s` before it has two steps to measure) is stalled. The detector then names
the stage that holds the flow back, from what the collector already knows:

- the feeder: `feeder.ahead` at or past the admission window means it waits for the trainers;
- the workers: episodes in flight (`worker.in_flight`), and the lag of `tasks` (work not taken);
- streams: the lag of `trajectories` and the trajectories pending in incomplete groups.

A feeder blocked at its window while no task, episode or trajectory is anywhere in flight is a
leak of the admission window (groups that were fed but will never be counted consumed): that is
how a chaos run hung at step 81. The event reads, for example,
"stall: trainer solver at step 81 for 95 s; feeder blocked at ahead 24; workers idle; tasks lag 0;
streams lag 0, 0 pending; suspect: the feeder's admission window (nothing is in flight anywhere)".

`stall_line` is pure (golden tests in tests/e2e/test_stall.py); `StallDetector` keeps the step
clocks and says each stall once, and once that it ended.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from astraflow.runner.collector import Snapshot
from astraflow.topics import TASKS, TRAJECTORIES


@dataclass(frozen=True)
class Flow:
    """What the stages report at one moment (sums over instances)."""

    feeder_ahead: float | None = None
    window: float | None = None  # the admission window; None when admission is off
    episodes_in_flight: float = 0.0
    workers: int = 0
    tasks_lag: int | None = None
    streams_lag: int | None = None
    streams_pending: float = 0.0


def suspect(flow: Flow) -> str:
    """The stage that most likely holds the flow back."""
    blocked = flow.window is not None and flow.feeder_ahead is not None and flow.feeder_ahead >= flow.window
    if flow.workers == 0:
        return "the workers (none reports)"
    if flow.streams_lag:
        return f"streams ({flow.streams_lag} trajectories not consumed)"
    if flow.tasks_lag and not flow.episodes_in_flight:
        return f"the workers ({flow.tasks_lag} tasks waiting, no episode running)"
    if flow.episodes_in_flight or flow.tasks_lag:
        return "the workers (rollouts in progress)"
    if flow.streams_pending:
        return f"streams ({flow.streams_pending:.0f} trajectories wait in incomplete groups)"
    if blocked:
        return "the feeder's admission window (nothing is in flight anywhere)"
    if flow.feeder_ahead is not None and flow.feeder_ahead <= 0:
        return "the feeder (nothing published ahead of the trainers)"
    return "the trainer (samples were produced but not trained)"


def stall_line(policy: str, step: int, stalled_s: float, flow: Flow) -> str:
    """The event of one stalled trainer."""
    parts = [f"stall: trainer {policy} at step {step} for {stalled_s:.0f} s"]
    if flow.feeder_ahead is None:
        parts.append("feeder silent")
    elif flow.window is not None and flow.feeder_ahead >= flow.window:
        parts.append(f"feeder blocked at ahead {flow.feeder_ahead:.0f}")
    else:
        parts.append(f"feeder ahead {flow.feeder_ahead:.0f}")
    parts.append(
        "workers idle"
        if not flow.episodes_in_flight
        else f"workers busy ({flow.episodes_in_flight:.0f} episodes in flight)"
    )
    parts.append(f"tasks lag {'-' if flow.tasks_lag is None else flow.tasks_lag}")
    parts.append(
        f"streams lag {'-' if flow.streams_lag is None else flow.streams_lag}, "
        f"{flow.streams_pending:.0f} pending"
    )
    parts.append(f"suspect: {suspect(flow)}")
    return "; ".join(parts)


@dataclass
class _Clock:
    step: int
    since: float
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=50))
    stalled: bool = False
    line: str = ""


@dataclass
class StallDetector:
    """Step clocks per trainer; `update` returns the events to emit (a stall, or its end)."""

    factor: float = 10.0
    min_s: float = 60.0
    first_step_s: float = 600.0
    clocks: dict[str, _Clock] = field(default_factory=dict)

    def limit(self, clock: _Clock) -> float:
        if len(clock.intervals) < 2:
            return max(self.min_s, self.first_step_s)
        return max(self.min_s, self.factor * statistics.median(clock.intervals))

    def update(
        self, steps: dict[str, int], now: float, flow: Flow, done: frozenset[str] = frozenset()
    ) -> list[str]:
        events = []
        for policy, step in steps.items():
            clock = self.clocks.get(policy)
            if clock is None:
                self.clocks[policy] = _Clock(step, now)
                continue
            if step > clock.step:
                clock.intervals.append((now - clock.since) / (step - clock.step))
                if clock.stalled:
                    events.append(
                        f"stall over: trainer {policy} at step {step} after {now - clock.since:.0f} s"
                    )
                clock.step, clock.since, clock.stalled = step, now, False
            elif policy not in done and not clock.stalled and now - clock.since >= self.limit(clock):
                clock.stalled = True
                clock.line = stall_line(policy, clock.step, now - clock.since, flow)
                events.append(clock.line)
        return events

    def stalled(self) -> list[str]:
        return sorted(p for p, c in self.clocks.items() if c.stalled)

    def current(self) -> str | None:
        """The stall events of the trainers still stalled (for the dashboard), or None."""
        lines = [self.clocks[p].line for p in self.stalled()]
        return "\n".join(lines) or None


def observe(snap: Snapshot, policies: list[str], window: float | None) -> tuple[dict[str, int], Flow]:
    """The trainers' steps (0 before their first report) and the flow, from a collector snapshot."""
    trainers = {i.id: i.values for i in snap.of("trainer")}
    steps = {p: int(trainers.get(f"trainer.{p}", {}).get("step", 0)) for p in policies}
    feeder = snap.of("feeder")
    workers = snap.of("worker")
    flow = Flow(
        feeder_ahead=feeder[0].values.get("feeder.ahead") if feeder else None,
        window=window,
        episodes_in_flight=sum(w.values.get("worker.in_flight", 0.0) for w in workers),
        workers=len(workers),
        tasks_lag=snap.lag.get(TASKS),
        streams_lag=snap.lag.get(TRAJECTORIES),
        streams_pending=sum(s.values.get("trajectories.pending", 0.0) for s in snap.of("streams")),
    )
    return steps, flow
