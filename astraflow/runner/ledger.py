"""The system-wide ledger of a run: what became of every task the feeder fed, per policy.

Built from durable records only, so it can be taken after any crash (and by a test that killed
components at random):
- fed: the Tasks on `tasks` (a group id seen twice there was published twice);
- trained: `<run_dir>/trainer/<policy>/trained.jsonl` (lines with `trained: true`); a line with
  `trained: false` is a batch discarded as stale, so its groups are dropped for the reason `stale`;
- dropped by streams: the newest TaskStats of each task on `task-stats` (`dropped_groups`: groups
  of the task that reach no trainer; streams counts each under its reason in its metrics);
- where the rest are: a group with Samples on `samples.<policy>` waits in the trainer, one with
  Trajectories on `trajectories` waits in streams, any other was not rolled out (yet).

At drain (the feeder stopped and everything it fed had time to finish) a sound run has every fed
group trained exactly once per policy or dropped with a reason, except fewer than `batch_groups`
complete groups per policy that wait in the trainer for a batch that no new task will fill. A
group anywhere else was lost; one trained twice was duplicated. `Ledger.problems` says which.

`python -m astraflow.runner.ledger RUN_DIR` prints the ledger of a run whose broker is reachable
(ASTRAFLOW_BOOTSTRAP / ASTRAFLOW_NAMESPACE as for the run, or the run's own local broker).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from astraflow.config import KafkaSettings
from astraflow.kafka import read_to_end
from astraflow.records import Sample, SampleBatch, Task, TaskStats, Trajectory, TrajectoryBatch
from astraflow.topics import TASK_STATS, TASKS, TRAJECTORIES, samples

WAITING = ("at_trainer", "in_streams", "not_rolled_out")


@dataclass
class PolicyLedger:
    """The fate of each fed group for one policy."""

    policy: str
    trained: Counter[str] = field(default_factory=Counter)
    """group id -> batches that trained it (the trainer's ledger after its crash truncation)."""
    stale: set[str] = field(default_factory=set)
    dropped: set[str] = field(default_factory=set)
    """dropped by a streams filter, a failed stage or a group timeout (TaskStats.dropped_groups)."""
    at_trainer: set[str] = field(default_factory=set)
    in_streams: set[str] = field(default_factory=set)
    not_rolled_out: set[str] = field(default_factory=set)
    never_fed: set[str] = field(default_factory=set)
    """trained although no task of that group was fed: a ledger that does not add up."""

    def counts(self) -> dict[str, int]:
        return {
            "trained": sum(1 for n in self.trained.values() if n),
            "duplicated": self.duplicated(),
            "stale": len(self.stale),
            "dropped": len(self.dropped),
            "at_trainer": len(self.at_trainer),
            "in_streams": len(self.in_streams),
            "not_rolled_out": len(self.not_rolled_out),
            "never_fed": len(self.never_fed),
        }

    def duplicated(self) -> int:
        return sum(n - 1 for n in self.trained.values() if n > 1)


@dataclass
class Ledger:
    fed: Counter[str]
    policies: dict[str, PolicyLedger]
    stream_drop_reasons: dict[str, float]
    """streams' `trajectories.dropped.<reason>` and `groups.dropped`, summed over its restarts (from
    metrics.jsonl; a killed process's last few seconds are missing, so this is for reading only)."""

    def refed(self) -> int:
        return sum(n - 1 for n in self.fed.values() if n > 1)

    def problems(self, batch_groups: int, drained: bool = True) -> list[str]:
        """Everything that breaks "nothing duplicated, nothing lost"; empty for a sound run. With
        `drained=False` (taken while tasks are still in flight) only duplicates count."""
        out = []
        if self.refed():
            out.append(
                f"{self.refed()} tasks published twice: {sorted(g for g, n in self.fed.items() if n > 1)[:5]}"
            )
        for p, pl in self.policies.items():
            if pl.duplicated():
                out.append(
                    f"{p}: {pl.duplicated()} groups trained twice: "
                    f"{sorted(g for g, n in pl.trained.items() if n > 1)[:5]}"
                )
            if pl.never_fed:
                out.append(
                    f"{p}: {len(pl.never_fed)} trained groups were never fed: {sorted(pl.never_fed)[:5]}"
                )
            if not drained:
                continue
            if len(pl.at_trainer) >= batch_groups:
                out.append(
                    f"{p}: {len(pl.at_trainer)} complete groups wait in the trainer (a batch is "
                    f"{batch_groups}): {sorted(pl.at_trainer)[:5]}"
                )
            for where in ("in_streams", "not_rolled_out"):
                lost = getattr(pl, where)
                if lost:
                    out.append(f"{p}: {len(lost)} groups lost {where.replace('_', ' ')}: {sorted(lost)[:5]}")
        return out

    def line(self) -> str:
        parts = [f"fed {sum(self.fed.values())} ({self.refed()} twice)"]
        for p, pl in self.policies.items():
            c = pl.counts()
            parts.append(f"{p}: " + ", ".join(f"{k} {v}" for k, v in c.items() if v or k == "trained"))
        reasons = ", ".join(f"{k} {v:.0f}" for k, v in sorted(self.stream_drop_reasons.items()) if v)
        return "; ".join(parts) + (f"; streams metrics: {reasons}" if reasons else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "fed": sum(self.fed.values()),
            "refed": self.refed(),
            "policies": {p: pl.counts() for p, pl in self.policies.items()},
            "stream_drop_reasons": self.stream_drop_reasons,
        }


def trainer_ledger(run_dir: Path, policy: str) -> list[dict[str, Any]]:
    path = Path(run_dir) / "trainer" / policy / "trained.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stream_drop_reasons(run_dir: Path) -> dict[str, float]:
    """Counters of streams that name a reason, summed across restarts (a counter that goes down
    started again from zero)."""
    path = Path(run_dir) / "metrics.jsonl"
    last: dict[tuple[str, str], float] = {}
    total: Counter[str] = Counter()
    if not path.exists():
        return {}
    for line in path.read_text().splitlines():
        if '"streams"' not in line:
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut by a SIGKILL of the supervisor
        if row.get("component") != "streams":
            continue
        for key, value in row.get("values", {}).items():
            if not (key.startswith("trajectories.dropped.") or key == "groups.dropped"):
                continue
            before = last.get((row["id"], key), 0.0)
            total[key] += value - before if value >= before else value
            last[(row["id"], key)] = value
    return dict(total)


def build(run_dir: Path, settings: KafkaSettings, policies: list[str], timeout: float = 120.0) -> Ledger:
    """The ledger of the run in `run_dir` whose topics `settings` reaches (read to their ends now)."""
    fed: Counter[str] = Counter()
    tasks_of: dict[str, list[str]] = {}
    for _, rec in read_to_end(settings, TASKS, timeout):
        if isinstance(rec, Task):
            fed[rec.group_id] += 1
            if fed[rec.group_id] == 1:
                tasks_of.setdefault(rec.task_id, []).append(rec.group_id)
    stats: dict[str, TaskStats] = {}
    for _, rec in read_to_end(settings, TASK_STATS, timeout):
        if isinstance(rec, TaskStats):
            stats[rec.task_id] = rec  # compacted by task: the newest counts
    rolled = {
        rec.group_id
        for _, rec in read_to_end(settings, TRAJECTORIES, timeout)
        if isinstance(rec, (Trajectory, TrajectoryBatch))
    }
    ledgers = {}
    for policy in policies:
        pl = PolicyLedger(policy)
        for entry in trainer_ledger(run_dir, policy):
            if entry.get("trained"):
                pl.trained.update(entry["groups"])
            else:
                pl.stale.update(entry["groups"])
        pl.stale -= set(pl.trained)  # a group of a discarded batch retrained later was trained
        sampled = {
            rec.group_id
            for _, rec in read_to_end(settings, samples(policy), timeout)
            if isinstance(rec, (Sample, SampleBatch))
        }
        pl.never_fed = {g for g in [*pl.trained, *pl.stale] if g not in fed}
        for task_id, groups in tasks_of.items():
            open_groups = [g for g in groups if g not in pl.trained and g not in pl.stale]
            drops = stats[task_id].dropped_groups if task_id in stats else 0
            # streams drops a group before it reaches the trainer: a group with no Samples is the one
            open_groups.sort(key=lambda g: g in sampled)
            for g in open_groups[:drops]:
                pl.dropped.add(g)
            for g in open_groups[drops:]:
                where = pl.at_trainer if g in sampled else pl.in_streams if g in rolled else pl.not_rolled_out
                where.add(g)
        ledgers[policy] = pl
    return Ledger(fed=fed, policies=ledgers, stream_drop_reasons=stream_drop_reasons(run_dir))


def main(argv: list[str] | None = None) -> int:
    from astraflow import broker
    from astraflow.config import load_recipe

    args = argv if argv is not None else sys.argv[1:]
    run_dir = Path(args[0])
    recipe = load_recipe(run_dir / "recipe.yaml")
    settings = KafkaSettings.from_env(recipe.kafka)
    if not settings.bootstrap:
        local = broker.local_bootstrap(run_dir / "broker")
        if local is None:
            print(
                f"no broker: set ASTRAFLOW_BOOTSTRAP or start the run's own ({run_dir / 'broker'})",
                file=sys.stderr,
            )
            return 2
        settings = settings.model_copy(update={"bootstrap": local})
    ledger = build(run_dir, settings, recipe.policy_names)
    print(ledger.line())
    for problem in ledger.problems(recipe.trainer.batch_groups):
        print("problem:", problem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
