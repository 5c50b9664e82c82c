"""`astraflow feed`: writes Tasks to the `tasks` topic, as fast as the trainers can use them.

Sources: an environment's generator (deterministic: the same seed gives the same tasks, ids and
attempts) or a JSONL file. Two controls sit between the source and the topic:
- admission: at most (max_staleness + 1) x trainer.publish_every x trainer.batch_groups groups may
  be ahead of the slowest trainer (more would be stale when trained), or `feeder.ahead_groups`.
  A trainer's progress is the larger of WeightVersion.groups_consumed (groups trained or discarded
  as stale) and WeightVersion.step x batch_groups, from the compacted `weights` topic; groups that
  reach no trainer (TaskStats.dropped_groups: dropped by a streams filter, a failed stage or a
  group timeout) count as consumed too. Groups published so far are the records in `tasks`, so a
  restarted feeder keeps the same budget.
- selective rollout (`feeder.selective`): tasks whose TaskStats say they are always or never solved
  are skipped, except a `keep_fraction` of them and any task after `max_skips_in_row` skips.
Each task goes to the worker with the fewest tasks not yet done, in one partition of `tasks` it owns
(`feeder.routing`, workers/routing.py), so workers that finish sooner are given more.
A restarted feeder resumes its source exactly where it stopped: `<run_dir>/feeder/state.json` holds
its position and the end offsets of `tasks` at that moment (saved every 64 tasks), and the tasks
published after those offsets are skipped when the source yields them again (workers/feeder_state.py).

Metrics (component `feeder`): feeder.published, feeder.skipped, feeder.blocked_s, feeder.ahead,
feeder.trainer_groups, feeder.deadletters, feeder.resume_skipped (tasks not published again after a
restart), feeder.stats_evicted, feeder.stats_tasks, feeder.outstanding (tasks published and not yet
committed by the workers, as routing last saw them), feeder.routing_queues (the workers routing tells
apart by their commits, plus each partition with no commit yet).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from astraflow import gcpause
from astraflow.config import KafkaSettings, Recipe
from astraflow.deadletters import DeadLetters
from astraflow.errors import ConfigError
from astraflow.kafka import Publisher, TopicReader
from astraflow.metrics import MetricsReporter
from astraflow.records import RecordError, Task, TaskStats, WeightVersion, decode
from astraflow.weights.auth import verify
from workers.feeder_state import StatsCache, published_since
from workers.registry import environment_class, workflow_class
from workers.routing import LeastOutstanding, LoadProbe

log = logging.getLogger(__name__)


def default_roles(recipe: Recipe, env_name: str) -> dict[str, str]:
    """The feeder's roles, or the workflow's roles over the recipe's policies in order."""
    if recipe.feeder.roles:
        return dict(recipe.feeder.roles)
    env_cls = environment_class(env_name)
    wf_cls = workflow_class(recipe.worker.workflow or env_cls.default_workflow)
    names = recipe.policy_names
    return {role: names[i % len(names)] for i, role in enumerate(wf_cls.roles)}


def generated_tasks(recipe: Recipe) -> Iterator[Task]:
    """The generator's endless, deterministic stream of Tasks."""
    cfg = recipe.feeder
    env = environment_class(cfg.env)(**cfg.env_args)
    roles = default_roles(recipe, cfg.env)
    for spec, attempt in env.tasks(cfg.seed):
        yield Task(
            task_id=f"{cfg.env}-s{cfg.seed}-{spec.key}",
            env=cfg.env,
            roles=roles,
            group_size=cfg.group_size,
            prompt=spec.prompt,
            seed=spec.seed,
            payload=spec.payload,
            attempt=attempt,
        )


def jsonl_tasks(recipe: Recipe, path: Path, dead: DeadLetters | None = None) -> Iterator[Task]:
    """Tasks of a JSONL file; a bad line is dead-lettered (file, line number, reason) and skipped."""
    cfg = recipe.feeder
    known = frozenset(recipe.policy_names)
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
                if not isinstance(row, dict):
                    raise ValueError("expected a JSON object")
                env = row.get("env", cfg.env)
                environment_class(env)
                task = Task(
                    task_id=str(row.get("task_id") or f"{path.stem}-{lineno}"),
                    env=env,
                    roles=row.get("roles") or default_roles(recipe, env),
                    group_size=int(row.get("group_size", cfg.group_size)),
                    prompt=row.get("prompt"),
                    seed=row.get("seed"),
                    payload=row.get("payload", {}),
                    attempt=int(row.get("attempt", 0)),
                )
                task.validate(known)
            except (ValueError, TypeError, RecordError, ConfigError) as exc:
                msg = f"{path}:{lineno}: {exc}"
                if dead is None:
                    raise ConfigError(msg) from None
                dead.publish(str(path), -1, lineno, None, raw, msg)
                continue
            yield task


class Feeder:
    def __init__(
        self, recipe: Recipe, run_dir: Path, settings: KafkaSettings, jsonl: Path | None = None
    ) -> None:
        self.recipe = recipe
        self.cfg = recipe.feeder
        self.run_dir = Path(run_dir)
        self.settings = settings
        self.jsonl = Path(jsonl) if jsonl else (Path(self.cfg.jsonl) if self.cfg.jsonl else None)
        self.state_file = self.run_dir / "feeder" / "state.json"
        self.consumed: dict[str, int] = {}  # policy -> groups its trainer has consumed
        self.versions: dict[str, int] = {}  # policy -> newest weight version announced (Task.min_versions)
        self.stats = StatsCache(self.cfg.max_task_stats)
        self.resume_skip: set[str] = set()  # group ids published after the last save, before a crash
        self.stopping = False
        self.published = 0
        self.counts = {"published": 0, "skipped": 0, "deadletters": 0, "resume_skipped": 0}
        self.blocked_s = 0.0
        self.rng = random.Random(f"selective:{self.cfg.seed}")
        self.routing = LeastOutstanding()
        self.probe: LoadProbe | None = None  # None: tasks go by their key (feeder.routing: task_id)
        self.skips_in_row = 0
        where, _, n = os.environ.get("ASTRAFLOW_FEEDER_FAILPOINT", "").partition(":")
        self.failpoint = int(n) if where == "after_publish" and n.isdigit() else None

    # ------------------------------------------------------------------ progress

    def _open_readers(self) -> TopicReader:
        # task-stats feeds selective rollout and admission (groups streams dropped count as consumed)
        reader = TopicReader(
            self.settings,
            ["weights", "task-stats"],
            from_beginning=True,
            group=f"feeder-reader-{uuid.uuid4().hex[:8]}",
            **{"enable.auto.commit": False},
        )
        # (topic, partition) -> end offset at start
        self._history: dict[tuple[str, int], int] = {tp: high for tp, high in reader.ends.items() if high > 0}
        self.task_ends = reader.end_offsets(self.settings.topic("tasks"))
        self.published = sum(self.task_ends.values())
        self.routing.observe(ends=self.task_ends)
        if self.cfg.routing == "least_outstanding":
            self.probe = LoadProbe(self.settings, self.recipe.worker.group, self.cfg.routing_refresh_s)
        return reader

    def _partition(self) -> int:
        """Where the next task goes: the partition with the least work outstanding, or -1 (its key)."""
        if self.probe is None:
            return -1
        self.probe.refresh(self.routing)
        partition = self.routing.pick()
        self.routing.sent(partition)
        return partition

    def _read_progress(self, reader: TopicReader, budget_s: float = 0.0) -> None:
        """Read what progress records are ready; with a budget, wait up to it for the first one.
        Returns as soon as something was read (admission reacts to the event itself, not to the end
        of a polling interval: that wait was a tenth of a second of every step of a blocked run)."""
        deadline = time.monotonic() + budget_s
        timeout = budget_s
        while True:
            msg = reader.poll(timeout)
            if msg is None:
                if time.monotonic() >= deadline or timeout == 0:
                    return
                timeout = max(0.0, deadline - time.monotonic())
                continue
            timeout = 0.0  # something arrived: drain what else is ready, then return
            try:
                rec = decode(msg.value() or b"")
                if isinstance(rec, WeightVersion):
                    verify(rec)  # a forged event must not open the admission window
            except RecordError as exc:
                self.dead.publish_message(msg, str(exc))
                self.counts["deadletters"] += 1
                continue
            if isinstance(rec, WeightVersion):
                consumed = max(rec.groups_consumed, rec.step * self.recipe.trainer.batch_groups)
                self.consumed[rec.policy] = max(self.consumed.get(rec.policy, 0), consumed)
                self.versions[rec.policy] = max(self.versions.get(rec.policy, 0), rec.version)
            elif isinstance(rec, TaskStats):
                self.stats.put(rec)

    def _catch_up(self, reader: TopicReader, timeout: float = 60.0) -> None:
        """Read the progress topics up to where they ended at start, so a restarted feeder admits
        from what the trainers really consumed, not from the first records that happen to arrive."""
        from confluent_kafka import TopicPartition

        deadline = time.monotonic() + timeout
        while self._history and time.monotonic() < deadline:
            self._read_progress(reader, budget_s=0.2)
            positions = reader.consumer.position([TopicPartition(t, p) for t, p in self._history])
            for tp in positions:
                if tp.offset >= self._history[(tp.topic, tp.partition)]:
                    del self._history[(tp.topic, tp.partition)]
        if self._history:
            log.warning(
                "feeder: progress topics not read to their end within %.0fs; admitting from what was read",
                timeout,
            )

    def trainer_groups(self) -> int:
        """Groups consumed so far by the slowest trainer, plus the groups that reach no trainer."""
        trained = min(self.consumed.get(p, 0) for p in self.recipe.policy_names)
        return trained + self.stats.dropped

    def admitted(self) -> bool:
        if not self.cfg.admission:
            return True
        return self.published - self.trainer_groups() < self.recipe.admission_window

    def skip(self, task: Task) -> bool:
        sel = self.cfg.selective
        st = self.stats.get(task.task_id)
        if not sel.enabled or st is None or st.groups < sel.min_groups:
            return False
        unsolved = sel.unsolved_below is not None and st.success_rate <= sel.unsolved_below
        teaches_nothing = st.success_rate >= sel.solved_above or unsolved
        return not (
            not teaches_nothing
            or self.skips_in_row >= sel.max_skips_in_row
            or self.rng.random() < sel.keep_fraction
        )

    # ------------------------------------------------------------------ main loop

    def _source(self) -> Iterator[Task]:
        if self.jsonl is not None:
            return jsonl_tasks(self.recipe, self.jsonl, self.dead)
        return generated_tasks(self.recipe)

    def _load_position(self) -> tuple[int, dict[int, int]]:
        """(position in the source, end offsets of `tasks` when it was saved); a state without
        offsets (an older feeder's, or none) means every task on the topic is checked."""
        try:
            state = json.loads(self.state_file.read_text())
            return int(state["next"]), {int(p): int(o) for p, o in state.get("ends", {}).items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return 0, {}

    def _save_position(self, position: int) -> None:
        """Called after a flush: every task counted in `position` is on the topic below the ends,
        which are the ends at start moved past every task this feeder had acknowledged (asking the
        broker for its watermarks instead took about 3 s here, every 64 tasks)."""
        topic = self.settings.topic("tasks")
        ends = dict(self.task_ends)
        for (name, p), end in self.publisher.acked_ends.items():
            if name == topic:
                ends[p] = max(ends.get(p, 0), end)
        state: dict[str, Any] = {
            "next": position,
            "published": self.published,
            "ends": {str(p): o for p, o in sorted(ends.items())},
        }
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.state_file)

    def _resume(self, saved_ends: dict[int, int]) -> None:
        """Find the tasks published after the saved position (a crash between two saves)."""
        reader = TopicReader(
            self.settings,
            group=f"feeder-reader-resume-{uuid.uuid4().hex[:8]}",
            **{"enable.auto.commit": False},
        )
        try:
            self.resume_skip = published_since(
                reader, self.settings.topic("tasks"), saved_ends, self.task_ends
            )
        finally:
            reader.close()
        if self.resume_skip:
            log.warning(
                "feeder: %d tasks were published after the last saved position; they are not published again",
                len(self.resume_skip),
            )

    def stop(self, *_: Any) -> None:
        self.stopping = True

    def _sigkill(self) -> None:
        """Fault injection (ASTRAFLOW_FEEDER_FAILPOINT=after_publish:N): once the N-th task of this
        process is acknowledged, die by SIGKILL, between two position saves when N % 64 != 0."""
        self.publisher.flush(60)
        log.warning("failpoint after_publish:%d: SIGKILL", self.failpoint)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)

    def run(self, worker_id: str = "feeder") -> int:
        """Feed until `max_tasks`, the end of the JSONL file, or SIGTERM/SIGINT. Returns tasks fed."""
        if threading.current_thread() is threading.main_thread():  # embedded feeders are stopped by stop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self.stop)
        self.publisher = Publisher(self.settings)
        self.dead = DeadLetters(self.publisher, "feeder")
        metrics = MetricsReporter(self.publisher, "feeder", worker_id, self.settings.region, every_s=5.0)
        readers = self._open_readers()
        position, saved_ends = self._load_position()
        if position == 0 and any(self.recipe.trainer_for(p).warmup for p in self.recipe.policy_names):
            # a feeder that starts the run; one that resumes wrote them before its first task
            from workers.demonstrations import publish_demonstrations

            publish_demonstrations(self.recipe, self.run_dir, self.publisher)
        source = itertools.islice(self._source(), position, None)
        try:
            self._resume(saved_ends)
            self._catch_up(readers)
            gcpause.settle()
            for task in source:
                if task.group_id in self.resume_skip:  # on the topic already, from before a crash
                    self.resume_skip.discard(task.group_id)
                    self.counts["resume_skipped"] += 1
                    position += 1
                    continue
                while not self.stopping and not self.admitted():
                    start = time.monotonic()
                    self._read_progress(readers, budget_s=self.cfg.poll_s)
                    self.blocked_s += time.monotonic() - start
                    self._report(metrics)
                if self.stopping:
                    break
                position += 1
                self._read_progress(readers)
                if self.skip(task):
                    self.counts["skipped"] += 1
                    self.skips_in_row += 1
                    continue
                self.skips_in_row = 0
                task.min_versions = {p: v for p, v in self.versions.items() if p in task.roles.values()}
                self.publisher.send("tasks", task, key=task.task_id, partition=self._partition())
                self.published += 1
                self.counts["published"] += 1
                if self.counts["published"] == self.failpoint:
                    self._sigkill()
                if self.counts["published"] % 64 == 0:
                    self.publisher.flush(60)
                    self._save_position(position)
                self._report(metrics)
                if self.cfg.max_tasks is not None and self.counts["published"] >= self.cfg.max_tasks:
                    break
        finally:
            self._report(metrics, force=True)
            self.publisher.flush(60)
            self._save_position(position)
            readers.close()
            if self.probe is not None:
                self.probe.close()
        log.info("feeder stopped: %s", self.counts)
        return self.counts["published"]

    def _report(self, metrics: MetricsReporter, force: bool = False) -> None:
        self.counts["deadletters"] = max(self.counts["deadletters"], self.dead.count)
        values = {f"feeder.{k}": float(v) for k, v in self.counts.items()}
        values.update(
            {
                "feeder.blocked_s": self.blocked_s,
                "feeder.trainer_groups": float(self.trainer_groups()),
                "feeder.ahead": float(self.published - self.trainer_groups()),
                "feeder.stats_evicted": float(self.stats.evicted),
                "feeder.stats_tasks": float(len(self.stats)),
            }
        )
        if self.probe is not None:
            values["feeder.outstanding"] = float(self.routing.total())
            values["feeder.routing_queues"] = float(len(self.routing.queues()))
        metrics.report(values, force=force)
