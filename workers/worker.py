"""`astraflow worker`: a member of the consumer group on `tasks` that turns tasks into trajectories.

Dataflow: tasks (consumer group, elastic) -> episodes (many at once, one engine per policy, the torch
engine batching across them) -> trajectories (idempotent producer, key group_id, in the partition the
task_id hashes to; a task's trajectories go together, as one TrajectoryBatch record:
workers/batching.py). A task's offset is stored only when
all its trajectories are acknowledged by the broker and every earlier task of its partition is done
too (`OffsetTracker`), so a worker killed at any moment loses nothing: its tasks are re-run by
whoever gets the partition, and the deterministic traj_ids let streams drop duplicates. Partitions
move with cooperative-sticky rebalancing; tasks of a revoked partition are cancelled (released)
rather than finished twice.
SIGTERM/SIGINT: stop taking tasks, let in-flight episodes finish for `worker.drain_timeout_s`, release
the rest, flush, commit, close.

Metrics (component `worker`): worker.tokens_per_s, .tokens, .episodes, .trajectories, .tasks_done,
.tasks_released, .deadletters, .episode_errors, .in_flight (episodes of tasks taken, running or queued),
.episodes_running (at most max_episodes), .max_episodes, .episode_s (episodes x seconds in flight),
.tasks_in_flight, .weights_applied, .weights_refused, .weight_version.<policy>.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from astraflow import gcpause
from astraflow.config import KafkaSettings, Recipe
from astraflow.deadletters import DeadLetters, decode_or_deadletter
from astraflow.errors import AstraFlowError
from astraflow.failpoints import episode_delay_s
from astraflow.kafka import Publisher, TopicReader, partitions_of, wait_for_topics
from astraflow.metrics import MetricsReporter
from astraflow.records import Task, Trajectory
from workers.batching import send_as_they_end, send_batches
from workers.engines.base import InferenceEngine
from workers.episodes import Runtime, refusal, run_episode
from workers.follower import WeightFollower
from workers.offsets import OffsetTracker
from workers.startup import build_engines, commit_token, default_worker_id, task_consumer_overrides

log = logging.getLogger(__name__)
#: How often the serving loop looks for new tasks and delivery acknowledgements when idle: a task
#: waits at most this long after it is admitted (20 ms before: a tenth of a tiny recipe's step).
POLL_TICK_S = 0.005
#: ... until it has held no task for IDLE_AFTER_S; from then on it looks every IDLE_TICK_S, and the
#: first task after the lull waits up to that long. 200 passes a second cost a worker with nothing to
#: do 19 ms of CPU a second (a worker waiting in a region, a run whose trainer is busy elsewhere); in
#: a run, tasks come every step and the loop never slows down.
IDLE_AFTER_S = 1.0
IDLE_TICK_S = 0.05


def serve_tick(busy: bool, idle_for: float) -> float:
    """How long the serving loop sleeps after a pass that found no task: POLL_TICK_S while tasks are
    in flight or the last one came less than IDLE_AFTER_S ago, else IDLE_TICK_S."""
    return POLL_TICK_S if busy or idle_for < IDLE_AFTER_S else IDLE_TICK_S


def take_partitions(consumer: Any, partitions: list[Any], paused: bool) -> None:
    """The assignment callback's work: assign `partitions` (incrementally) and set their pause flag
    to `paused`, the state of the worker's other partitions, whatever it was. librdkafka keeps a
    partition's pause flag on a consumer across a revoke and a later re-assign (its issue #1849): a
    partition revoked while the worker was paused and given back while it took tasks stayed paused
    for good, and its tasks never ran (CI: 6 of 72 in tests/workers/test_elastic.py after a kill).
    Pausing needs the partitions assigned, so this assigns them rather than the client after it."""
    consumer.incremental_assign(partitions)
    if paused:
        consumer.pause(partitions)
    else:
        consumer.resume(partitions)


class Worker:
    def __init__(
        self,
        recipe: Recipe,
        run_dir: Path,
        settings: KafkaSettings,
        worker_id: str | None = None,
        region: str | None = None,
    ) -> None:
        self.recipe = recipe
        self.cfg = recipe.worker
        self.run_dir = Path(run_dir)
        self.settings = settings
        self.worker_id = worker_id or default_worker_id()
        self.token = commit_token(self.worker_id)  # the metadata of its commits: the feeder's routing
        self.region = region or settings.region
        self.policies = frozenset(recipe.policy_names)
        self.tracker = OffsetTracker()
        self.tasks: dict[tuple[int, int], asyncio.Task[None]] = {}
        self.pending_episodes = 0
        self.traj_partitions = 0  # of `trajectories`, which a task's records hash among (send_batches)
        # a task's episodes queue here: at most max_episodes run at once, whatever the group_size
        self.slots = asyncio.Semaphore(self.cfg.max_episodes)
        self.running_episodes = 0
        # episodes x seconds in flight, integrated by the serve loop: its growth over time and
        # max_episodes is how busy the worker was (the scaling advice reads it)
        self.episode_s, self._episodes_mark = 0.0, time.monotonic()
        self._last_task = time.monotonic()  # when the serving loop last took a task (see serve_tick)
        self.stopping = asyncio.Event()
        self.paused = False
        self.assigned: set[int] = set()
        self.counts = {
            k: 0
            for k in (
                "tokens",
                "episodes",
                "trajectories",
                "tasks_done",
                "tasks_released",
                "deadletters",
                "episode_errors",
                "weights_late",
            )
        }
        self.engines: dict[str, InferenceEngine] = {}
        self.topic = settings.topic("tasks")
        self.episode_delay_s = episode_delay_s()

    # ------------------------------------------------------------------ setup

    def _build(self) -> None:
        self.codec, engines = build_engines(self.recipe, self.policies, self.run_dir, self.worker_id)
        self.runtime = Runtime(self.recipe, self.codec)
        self.engines.update(engines)

    async def run(self) -> None:
        """Serve tasks until SIGTERM/SIGINT (or `stop()`)."""
        self.loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, self.stop)
        await asyncio.to_thread(self._build)
        await asyncio.to_thread(
            wait_for_topics, self.settings, ["tasks", "trajectories", "weights"], stopped=self.stopping.is_set
        )
        if self.stopping.is_set():  # stopped before its topics existed: nothing to connect to or close
            return
        self.publisher = Publisher(self.settings)
        self.traj_partitions = len(
            await asyncio.to_thread(
                partitions_of, self.publisher.producer, self.settings.topic("trajectories")
            )
        )
        self.dead = DeadLetters(self.publisher, "worker")
        self.metrics = MetricsReporter(
            self.publisher, "worker", self.worker_id, self.region, every_s=self.cfg.metrics_every_s
        )
        side = Publisher(self.settings)  # the follower's thread must not serve this loop's callbacks
        self.follower = WeightFollower(
            self.settings,
            self.engines,
            self.loop,
            DeadLetters(side, "worker"),
            cache_dir=self.run_dir / "cache" / "weights",
        )
        await asyncio.to_thread(self.follower.catch_up)
        self.follower.start()
        gcpause.settle()
        self.reader = TopicReader(
            self.settings, ["tasks"], group=self.cfg.group, **task_consumer_overrides(self.worker_id)
        )
        self.consumer = self.reader.consumer
        self.reader.subscribe(on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke)
        self._started = time.monotonic()
        self._tokens_mark = (time.monotonic(), 0)
        self._next_report = 0.0
        log.info("worker %s (%s) consuming %s", self.worker_id, self.region, self.topic)
        try:
            await self._serve()
        finally:
            await self._shutdown(side)

    def stop(self) -> None:
        self.stopping.set()

    # ------------------------------------------------------------------ consuming

    async def _serve(self) -> None:
        while not self.stopping.is_set():
            now = time.monotonic()
            self.episode_s += min(self.pending_episodes, self.cfg.max_episodes) * (now - self._episodes_mark)
            self._episodes_mark = now
            # Tasks are taken beyond the free slots, up to a queue of max_queued_episodes, and only then
            # are the partitions paused: librdkafka hands over the first record after a resume() about
            # 0.9 s late (measured on a local broker, whatever the fetch settings); without a queue,
            # tasks waited 0.46 s p50 from admission to their episodes in the arithmetic recipe.
            room = self.pending_episodes < self.cfg.max_episodes + self.cfg.max_queued_episodes
            if room and self.paused:
                self.consumer.resume(self.consumer.assignment())
                self.paused = False
            elif not room and not self.paused:
                self.consumer.pause(self.consumer.assignment())
                self.paused = True
            msg = self.reader.poll(0)
            if msg is not None:
                self._on_message(msg)
                self._last_task = now
                continue  # drain what is ready before sleeping
            self.publisher.poll(0)
            self._report()
            # a plain sleep, not a wait_for on `stopping`: that built a task and a timer each pass and
            # cost ~1.5x the CPU of this wake-up, 200 times a second (a stop is seen by the next pass)
            await asyncio.sleep(serve_tick(bool(self.tasks), now - self._last_task))

    def _on_message(self, msg: Any) -> None:
        p, off = msg.partition(), msg.offset()
        self.tracker.start(p, off)
        settled = self._dead_letter_settled(p, off)
        task = decode_or_deadletter(msg, Task, self.dead, self.policies, on_delivery=settled)
        refused = refusal(task, self.runtime, self.cfg.max_group_size) if task is not None else None
        if refused is not None:
            self.dead.publish_message(msg, refused, on_delivery=settled)
            task = None
        if task is None:
            self.counts["deadletters"] += 1
            return
        self._start(task, p, off)

    def _start(self, task: Task, partition: int, offset: int) -> asyncio.Task[None]:
        """Run a task; what it still holds is given back when it is done, however it ends: by a done
        callback, since a task cancelled before it first ran (its partition revoked by the poll that
        fetched it) never enters its coroutine; a `finally` there left its episodes counted forever,
        and the worker paused its partitions for good (CI: guess_number hung at step 4)."""
        held = [task.group_size]  # episode slots this task still holds; each episode frees its own
        self.pending_episodes += task.group_size
        key = (partition, offset)
        t = asyncio.create_task(self._run_task(task, partition, offset, held))
        self.tasks[key] = t

        def ended(_: asyncio.Task[None]) -> None:
            self.pending_episodes -= held[0]  # episodes that never started
            held[0] = 0
            if self.tasks.get(key) is t:
                del self.tasks[key]

        t.add_done_callback(ended)
        return t

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self.assigned |= {tp.partition for tp in partitions}
        log.info("worker %s assigned %s", self.worker_id, sorted(tp.partition for tp in partitions))
        take_partitions(consumer, partitions, self.paused)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        revoked = {tp.partition for tp in partitions}
        self.assigned -= revoked
        released = 0
        for (p, _off), t in list(self.tasks.items()):
            if p in revoked:
                t.cancel()  # the new owner re-runs it; nothing of it is committed here
                released += 1
        for p in revoked:
            self.tracker.forget(p)
        self.counts["tasks_released"] += released
        with contextlib.suppress(Exception):
            consumer.commit(asynchronous=False)
        log.info("worker %s revoked %s (released %d tasks)", self.worker_id, sorted(revoked), released)

    def _on_loop(self, fn: Callable[[Exception | None], None]) -> Callable[[Exception | None], None]:
        """A producer delivery callback that runs `fn(error or None)` on the worker's loop."""
        return lambda exc: self.loop.call_soon_threadsafe(fn, exc)

    def _dead_letter_settled(self, partition: int, offset: int) -> Callable[[Exception | None], None]:
        """Delivery callback of a bad task's dead letter: its offset is done once the broker has
        the dead letter; if the broker refused it, the task stays uncommitted and the worker stops."""

        def settle(exc: Exception | None) -> None:
            if exc is None:
                self._finished(partition, offset)
            else:
                log.error(
                    "dead letter of %s[%d]@%d not acknowledged (%s): it stays uncommitted",
                    self.topic,
                    partition,
                    offset,
                    exc,
                )
                self.stop()

        return self._on_loop(settle)

    def _finished(self, partition: int, offset: int) -> None:
        from confluent_kafka import TopicPartition

        position = self.tracker.finish(partition, offset)
        if position is not None and partition in self.assigned:
            done = TopicPartition(self.topic, partition, position, metadata=self.token)
            self.consumer.store_offsets(offsets=[done])

    # ------------------------------------------------------------------ running a task

    async def _run_task(self, task: Task, partition: int, offset: int, held: list[int]) -> None:
        try:
            await self._wait_for_weights(task)
            await asyncio.gather(*await self._roll_out(task, held))
        except asyncio.CancelledError:
            return
        except AstraFlowError as exc:  # a trajectory the broker did not take: leave the task uncommitted
            log.error("task %s: %s; it will be re-run", task.task_id, exc)
            self.stop()
            return
        self.counts["tasks_done"] += 1
        self._finished(partition, offset)

    async def _roll_out(self, task: Task, held: list[int]) -> list[asyncio.Future[None]]:
        """Run the task's episodes and send their trajectories as they end (`send_as_they_end`: a
        group's go together, none waiting long for a straggler); the broker's acknowledgements."""
        running = {asyncio.ensure_future(self._episode(task, k, held)) for k in range(task.group_size)}
        return await send_as_they_end(running, self._publish)

    async def _wait_for_weights(self, task: Task) -> None:
        """Hold a task until this worker's engines have the weights it was admitted with: the feeder
        hears of a version as soon as it is announced, the worker only once it has fetched and loaded
        it, and a task rolled out with the version before would exceed the staleness bound."""
        behind = {
            p: v for p, v in task.min_versions.items() if p in self.engines and self.engines[p].version < v
        }
        if not behind:
            return
        deadline = time.monotonic() + self.cfg.weights_wait_s
        while any(self.engines[p].version < v for p, v in behind.items()):
            if time.monotonic() > deadline:
                self.counts["weights_late"] += 1
                log.warning(
                    "task %s: weights %s not loaded after %.0f s; rolling it out with %s",
                    task.task_id,
                    behind,
                    self.cfg.weights_wait_s,
                    {p: self.engines[p].version for p in behind},
                )
                return
            await asyncio.sleep(POLL_TICK_S)

    async def _episode(self, task: Task, k: int, held: list[int]) -> list[Trajectory]:
        """Run one episode (when one of the `max_episodes` slots is free); its trajectories. Its slot
        is free as soon as it has finished (or failed, or was cancelled): the next task need not wait
        for this one's other episodes, nor for the broker to acknowledge its trajectories (the task's
        offset still does)."""
        try:
            async with self.slots:
                self.running_episodes += 1
                try:
                    if self.episode_delay_s:
                        await asyncio.sleep(self.episode_delay_s)
                    trajs, tokens = await run_episode(
                        self.runtime, task, k, self.engines, self.worker_id, self.region
                    )
                finally:
                    self.running_episodes -= 1
        finally:
            held[0] -= 1
            self.pending_episodes -= 1
        self.counts["episodes"] += 1
        self.counts["tokens"] += tokens
        return trajs

    def _publish(self, trajs: list[Trajectory]) -> list[asyncio.Future[None]]:
        """Send trajectories in as few records as fit (`send_batches`); a future per record, settled
        by the broker's acknowledgement (or its refusal)."""
        futures = send_batches(self.publisher, self.loop, trajs, self.traj_partitions)
        self.counts["episode_errors"] += sum(t.finish_reason == "error" for t in trajs)
        self.counts["trajectories"] += len(trajs)
        return futures

    # ------------------------------------------------------------------ metrics and shutdown

    def _report(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next_report:
            return
        self._next_report = now + self.cfg.metrics_every_s
        t0, n0 = self._tokens_mark
        rate = (self.counts["tokens"] - n0) / max(1e-9, now - t0)
        values = {f"worker.{k}": float(v) for k, v in self.counts.items()}
        values.update(
            {
                "worker.tokens_per_s": rate,
                "worker.in_flight": float(self.pending_episodes),
                "worker.episodes_running": float(self.running_episodes),
                "worker.max_episodes": float(self.cfg.max_episodes),
                "worker.episode_s": self.episode_s,
                "worker.tasks_in_flight": float(len(self.tasks)),
                "worker.weights_applied": float(self.follower.applied),
                "worker.weights_refused": float(self.follower.refused),
            }
        )
        for p, e in self.engines.items():
            values[f"worker.weight_version.{p}"] = float(e.version)
        self.metrics.report(values)
        self._tokens_mark = (now, self.counts["tokens"])

    async def _shutdown(self, side: Publisher) -> None:
        log.info("worker %s stopping: %d tasks in flight", self.worker_id, len(self.tasks))
        self.paused = True  # partitions assigned while draining start paused too (_on_assign)
        with contextlib.suppress(Exception):
            self.consumer.pause(self.consumer.assignment())
        late: set[asyncio.Task[None]] = set(self.tasks.values())
        deadline = time.monotonic() + self.cfg.drain_timeout_s
        while late and time.monotonic() < deadline:
            _, late = await asyncio.wait(late, timeout=0.05)
            self.publisher.poll(0)  # the delivery callbacks the tasks wait for are served here
            # A member that stops polling holds up every other member's rebalance until it leaves (13 s
            # in tests/e2e/test_elastic_scale.py); the partitions are paused: nothing more is taken.
            self.consumer.poll(0)
        if late:
            for t in late:
                t.cancel()
            self.counts["tasks_released"] += len(late)
            await asyncio.gather(*late, return_exceptions=True)
        try:
            self._report(force=True)
            self.publisher.flush(60)
            await asyncio.sleep(0)  # run the offset bookkeeping the flush's callbacks scheduled
        finally:
            with contextlib.suppress(Exception):
                self.consumer.commit(asynchronous=False)
            # Leave the group first: this worker's partitions stay paused, taken by no one, until
            # close(); stopping the weight follower (a fetch in progress) took seconds before it.
            self.consumer.close()
            await asyncio.to_thread(self.follower.close)  # a version being applied needs this loop to finish
            side.flush(10)
            for engine in self.engines.values():
                await engine.close()
            await self.runtime.close()
        log.info("worker %s stopped: %s", self.worker_id, self.counts)
