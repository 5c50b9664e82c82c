"""The pipeline: the recipe's list of algorithms, built, checked, and run on one group at a time.

    validate -> group -> [streams.pipeline, in recipe order] -> route

`validate` and `group` work on single records and on the group table (the Faust adapter in
streams/app.py drives them, configured by `streams.validate` and `streams.group`); the algorithms
of `streams.pipeline` are plain functions of a `Group`, run here with per-stage counting, and
`route` turns what survives into Samples. Nothing in this module touches Kafka, so the whole
chain is unit-testable with golden values.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from astraflow.config.streams import GroupConfig, StreamsConfig
from astraflow.errors import AstraFlowError, ConfigError
from astraflow.records import Sample
from streams.api import KINDS, Group, StageContext
from streams.metrics import Counters
from streams.registry import instantiate
from streams.route import route
from streams.stats import TaskStatsStage
from streams.validate import Validate


class StageError(AstraFlowError):
    """A stage raised on a group. The app dead-letters the group's trajectories and goes on."""

    def __init__(self, stage: str, group_id: str, exc: BaseException) -> None:
        self.stage, self.group_id = stage, group_id
        super().__init__(f"stage {stage!r} failed on group {group_id}: {type(exc).__name__}: {exc}")


@dataclass
class Pipeline:
    validate: Validate
    group: GroupConfig
    stages: list[tuple[str, Any]]
    ctx: StageContext
    counters: Counters = field(default_factory=Counters)

    @property
    def names(self) -> list[str]:
        return ["validate", "group", *(n for n, _ in self.stages), "route"]

    @property
    def task_stats(self) -> list[TaskStatsStage]:
        return [s for _, s in self.stages if isinstance(s, TaskStatsStage)]

    def run(self, group: Group) -> list[Group]:
        """Apply the group algorithms in order. Returns the groups that reach `route` (the fresh
        one first, if it survived, then any reused copies)."""
        c = self.counters
        current = [group]
        for name, stage in self.stages:
            observer = getattr(stage, "kind", None) == "observe"
            nxt: list[Group] = []
            t0 = time.perf_counter()
            for g in current:
                n_in, before = len(g), dict(g.drops)
                c.inc(f"stage.{name}.in", n_in)
                try:
                    result = stage(g)
                    if observer and (result is not g or len(g) != n_in):
                        raise ValueError(
                            "a stage of kind 'observe' must return the group it was given, whole"
                        )
                except Exception as exc:  # the boundary of third-party code: contain it
                    raise StageError(name, g.group_id, exc) from exc
                if result is None:
                    if g.dropped is None:
                        g.drop(name)
                    results = []
                elif isinstance(result, Group):
                    results = [result]
                else:
                    results = list(result)
                for reason, n in g.drops.items():
                    delta = n - before.get(reason, 0)
                    if delta:
                        c.inc(f"stage.{name}.dropped.{reason}", delta)
                        scope = "trajectories" if g.replayed == 0 else "replays"
                        c.inc(f"{scope}.dropped.{reason}", delta)
                for r in results:
                    if r is not g and r.replayed and r.replayed != g.replayed:
                        c.inc("trajectories.replayed", len(r))
                        c.inc("groups.replayed")
                    if r.dropped is None and len(r):
                        nxt.append(r)
                c.inc(f"stage.{name}.out", sum(len(r) for r in results if r.dropped is None))
            c.observe(f"stage.{name}.latency_ms", (time.perf_counter() - t0) * 1000.0)
            current = nxt
            if not current:
                break
        if group.dropped is not None or not group.trajectories:
            c.inc("groups.dropped")
        return current

    def to_samples(self, groups: list[Group], now: float | None = None) -> list[Sample]:
        """Route: the Samples of every group, counting trajectories that yield none."""
        c = self.counters
        t0 = time.perf_counter()
        out: list[Sample] = []
        for g in groups:
            c.inc("stage.route.in", len(g))
            try:
                samples = route(g, now)
            except (AstraFlowError, ValueError) as exc:
                raise StageError("route", g.group_id, exc) from exc
            routed = {s.traj_id for s in samples}
            lost = sum(1 for t in g.trajectories if t.traj_id not in routed)
            if lost:
                c.inc("stage.route.dropped.no_samples", lost)
                if g.replayed == 0:
                    c.inc("trajectories.dropped.no_samples", lost)
            c.inc("stage.route.out", len(g) - lost)
            if g.replayed == 0:
                c.inc("trajectories.out", len(g) - lost)
            for p in g.skip_policies:
                c.inc(f"samples.skipped.{p}", len(g.members(p)) if p in g.policies else 0)
            out.extend(samples)
        c.observe("stage.route.latency_ms", (time.perf_counter() - t0) * 1000.0)
        return out


def build_pipeline(config: StreamsConfig, ctx: StageContext) -> Pipeline:
    """Instantiate and check the recipe's pipeline. Errors are ConfigErrors naming the stage."""
    stages: list[tuple[str, Any]] = []
    seen_advantage = False
    for i, spec in enumerate(config.pipeline):
        where = f"streams.pipeline[{i}] ({spec.name})"
        stage = instantiate(spec.name, dict(spec.args), where)
        kind = getattr(stage, "kind", "transform")
        if kind not in KINDS:
            raise ConfigError(
                f"{where}: {spec.name!r} declares kind {kind!r}; a stage must be one of {', '.join(KINDS)}"
            )
        if not callable(stage):
            raise ConfigError(f"{where}: {spec.name!r} is not callable with a Group")
        if kind == "filter" and seen_advantage:
            # the estimator already computed each group's baseline from the samples a later filter
            # would drop: the advantages of the samples kept would be relative to the wrong mean
            raise ConfigError(
                f"{where}: filter {spec.name!r} comes after the advantage estimator; "
                "put filters before it so the baseline is computed on what is trained"
            )
        if kind == "advantage" and seen_advantage:
            raise ConfigError(f"{where}: a second advantage estimator {spec.name!r}; a pipeline has one")
        if kind == "reuse" and not seen_advantage:
            # a copy carries the advantages of the group it copies; before the estimator it would be
            # estimated again, and a windowed baseline (reinforce_pp) would count its rewards twice
            raise ConfigError(
                f"{where}: {spec.name!r} reuses groups before the advantage estimator; put it after"
            )
        seen_advantage |= kind == "advantage"
        setup = getattr(stage, "setup", None)
        if callable(setup):
            setup(ctx)
        stages.append((spec.name, stage))
    if not seen_advantage:
        raise ConfigError(
            "streams.pipeline: no advantage estimator "
            "(add one of grpo, dr_grpo, rloo, reinforce_pp_baseline, reinforce_pp "
            "or a plug-in of kind 'advantage')"
        )
    names = [s.name for s in config.pipeline]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        # two stages of one name would share metric names; refuse rather than mix their counts
        raise ConfigError(f"streams.pipeline: {sorted(duplicates)[0]!r} appears more than once")
    validate = Validate(**config.validation.model_dump())
    return Pipeline(validate=validate, group=config.group, stages=stages, ctx=ctx)
