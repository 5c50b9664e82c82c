"""Counters of the streams worker, published as Metric records (component `streams`) to `metrics`.

Counters are cumulative since the worker started; latencies are percentiles over the interval
since the previous report. Units: trajectories unless the name says otherwise.

    records.in                        records consumed from `trajectories` (a worker's TrajectoryBatch
                                      holds a group's trajectories; a Trajectory record, one)
    trajectories.in                   trajectories in them (a batch refused whole counts as one)
    trajectories.deadlettered         invalid, sent to `deadletter` (validate, or inconsistent with
                                      their group)
    trajectories.dropped.<reason>     duplicate, late (group already emitted), timeout,
                                      zero_variance, truncated, errored, stale, too_long,
                                      too_short, no_samples (no tokens of any routed policy),
                                      or the name of a plug-in stage that returned None
    trajectories.out                  routed: at least one Sample sent
    trajectories.pending              held in incomplete groups now (a gauge)
                                      in = out + sum(dropped) + deadlettered + pending
    trajectories.replayed             copies sent again by replay/mix (not part of the sum above)
    samples.out.<policy>              Samples produced to samples.<policy> (replays included)
    samples.skipped.<policy>          Samples not produced because a stage skipped the policy
    samples.recovered                 Samples found already on the topic when finishing a group
                                      whose emission a crash interrupted (not produced again)
    groups.emitted | groups.complete | groups.timeout_emitted | groups.timeout_dropped |
    groups.dropped | groups.recovered | groups.replayed | groups.pending
    stage.<name>.in | .out | .dropped.<reason> | .latency_ms.p50 | .latency_ms.p99
                                      per stage, in order: validate, group, the pipeline, route
    emit.batches                      emission batches: the groups queued while one batch is emitted
                                      form the next; each pays the protocol's two awaited round trips
    latency.emit_ms.p50 | .p99        last trajectory of a group consumed -> its Samples acknowledged
    latency.e2e_ms.p50 | .p99         newest trajectory's created_at -> its Samples acknowledged
                                      (spans hosts: includes clock skew)
    groups.waiting_for_bodies         emissions postponed until a re-delivered trajectory restores
                                      a body lost in a crash
    consumer.reseeks                  times the watchdog sought back to the committed offsets
    deadletter.count                  records sent to `deadletter`
    task_stats.published | task_stats.duplicates
                                      TaskStats records sent to `task-stats`; summaries seen twice
    task_stats.folded_at_emission     summaries folded as their group was emitted (it came from its
                                      task's partition), without the internal topic
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np


class Counters:
    """Named counters plus latency samples; `snapshot()` gives the dotted name -> value map."""

    def __init__(self) -> None:
        self.values: Counter[str] = Counter()
        self.gauges: dict[str, float] = {}
        self.samples: defaultdict[str, list[float]] = defaultdict(list)

    def inc(self, name: str, n: float = 1) -> None:
        self.values[name] += n

    def gauge(self, name: str, value: float) -> None:
        self.gauges[name] = float(value)

    def observe(self, name: str, value_ms: float) -> None:
        buf = self.samples[name]
        if len(buf) < 100_000:  # a bounded interval buffer: percentiles need no more
            buf.append(value_ms)

    def snapshot(self, reset_latency: bool = True) -> dict[str, float]:
        out: dict[str, float] = {k: float(v) for k, v in self.values.items()}
        out.update(self.gauges)
        for name, buf in self.samples.items():
            if buf:
                arr = np.asarray(buf)
                out[f"{name}.p50"] = float(np.percentile(arr, 50))
                out[f"{name}.p99"] = float(np.percentile(arr, 99))
        if reset_latency:
            self.samples = defaultdict(list)
        return out

    def dropped_total(self) -> float:
        return sum(v for k, v in self.values.items() if k.startswith("trajectories.dropped."))
