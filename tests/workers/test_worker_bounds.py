"""A worker runs at most `max_episodes` episodes at once, whatever a task's group_size, and
dead-letters a task whose group_size exceeds `max_group_size` (no broker: the loop is driven here)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from astraflow.config import KafkaSettings
from astraflow.errors import ConfigError
from astraflow.records import Task, encode
from workers import batching
from workers import worker as worker_mod
from workers.episodes import Runtime
from workers.worker import Worker

from .conftest import make_recipe


class _Dead:
    def __init__(self) -> None:
        self.letters: list[tuple[int, str]] = []

    def publish_message(self, msg: Any, error: str, on_delivery: Any = None) -> None:
        self.letters.append((msg.offset(), error))
        if on_delivery is not None:
            on_delivery(None)


class _Msg:
    def __init__(self, value: bytes, offset: int) -> None:
        self._value, self._offset = value, offset

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value

    def key(self) -> bytes:
        return b"k"

    def topic(self) -> str:
        return "tasks"


def _worker(tmp_path: Path, **cfg: Any) -> Worker:
    recipe = make_recipe(
        feeder={"env": "arithmetic", "group_size": 4},
        worker={"max_episodes": 4, "max_group_size": 256, **cfg},
    )
    worker = Worker(recipe, tmp_path, KafkaSettings(), worker_id="w-bounds", region="test")
    worker.runtime = Runtime(recipe, codec=None)  # type: ignore[arg-type]  # what _build makes; no tokenizer needed here
    return worker


def test_a_big_group_runs_at_most_max_episodes_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running, peak, started = 0, 0, []

    async def episode(runtime: Any, task: Task, k: int, *rest: Any) -> tuple[list[Any], int]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        started.append(k)
        await asyncio.sleep(0.001)
        running -= 1
        return [object()], 7

    monkeypatch.setattr(worker_mod, "run_episode", episode)
    w = _worker(tmp_path)

    async def main() -> None:
        w.loop = asyncio.get_running_loop()
        w.runtime = None  # type: ignore[assignment]  # run_episode is replaced
        w._publish = lambda traj: _acked(w.loop)  # type: ignore[method-assign]
        w.tracker.start(0, 0)
        task = Task(task_id="big", env="arithmetic", roles={"solver": "policy"}, group_size=200)
        await w._start(task, 0, 0)
        await asyncio.sleep(0)  # the task's done callback

    asyncio.run(main())
    assert sorted(started) == list(range(200))  # every episode ran, queued behind the limit
    assert peak == 4  # never more than max_episodes at once
    assert w.counts["tasks_done"] == 1 and w.counts["episodes"] == 200 and w.counts["tokens"] == 1400
    assert w.pending_episodes == 0 and w.running_episodes == 0 and w.tasks == {}


def _acked(loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
    fut: asyncio.Future[None] = loop.create_future()
    fut.set_result(None)
    return fut


@pytest.mark.parametrize(
    ("task", "reason"),
    [
        (
            Task(task_id="huge", env="arithmetic", roles={"solver": "policy"}, group_size=4096),
            "task huge: group_size 4096 exceeds worker.max_group_size 256",
        ),
        (
            Task(task_id="lost", env="nosuchenv", roles={"solver": "policy"}, group_size=4),
            (
                "task lost: unknown environment 'nosuchenv'; "
                "known: arithmetic, code, guess_number, referential_game, search"
            ),
        ),
    ],
)
def test_a_task_the_worker_cannot_run_is_dead_lettered_with_the_reason(
    tmp_path: Path, task: Task, reason: str
) -> None:
    w = _worker(tmp_path)
    w.dead = _Dead()  # type: ignore[assignment]

    async def main() -> None:
        w.loop = asyncio.get_running_loop()
        w._on_message(_Msg(encode(task), offset=0))
        for _ in range(3):
            await asyncio.sleep(0)  # the dead letter's delivery settles the offset on the loop

    asyncio.run(main())
    assert w.dead.letters == [(0, reason)]
    assert w.tasks == {} and w.pending_episodes == 0 and w.counts["deadletters"] == 1
    assert w.tracker.inflight(0) == 0 and w.tracker.position(0) == 1  # its offset may be committed


def test_a_recipe_whose_groups_no_worker_accepts_is_refused() -> None:
    with pytest.raises((ConfigError, ValueError), match="max_group_size"):
        make_recipe(feeder={"env": "arithmetic", "group_size": 2048}, worker={"max_group_size": 1024})


class _Tasks:
    """The `tasks` reader and consumer of a worker: endless tasks of 4 episodes; records pause()."""

    def __init__(self) -> None:
        self.offset, self.paused = 0, False

    def poll(self, timeout: float) -> _Msg | None:
        if self.paused:
            return None
        task = Task(task_id=f"t{self.offset}", env="arithmetic", roles={"solver": "policy"}, group_size=4)
        self.offset += 1
        return _Msg(encode(task), offset=self.offset - 1)

    def assignment(self) -> list[int]:
        return [0]

    def pause(self, partitions: list[int]) -> None:
        self.paused = True

    def resume(self, partitions: list[int]) -> None:
        self.paused = False


@pytest.mark.parametrize(("queued", "taken"), [(None, 1), (0, 1), (8, 3), (16, 5)])
def test_a_full_worker_keeps_taking_tasks_until_its_queue_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, queued: int | None, taken: int
) -> None:
    """Pausing the partitions at max_episodes made each task wait ~0.9 s for librdkafka's resume;
    with max_queued_episodes the worker takes tasks beyond its slots (default 0: only for free slots)."""
    running, peak = 0, 0

    async def episode(*args: Any) -> tuple[list[Any], int]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.Event().wait()  # never finishes
        return [], 0

    monkeypatch.setattr(worker_mod, "run_episode", episode)
    w = _worker(tmp_path, **({} if queued is None else {"max_queued_episodes": queued}))
    tasks = _Tasks()

    class _Quiet:
        def poll(self, timeout: float) -> None: ...

    async def main() -> None:
        w.loop = asyncio.get_running_loop()
        w.runtime = type("R", (), {"resolve": staticmethod(lambda task: (None, None))})()
        w.reader = w.consumer = tasks  # type: ignore[assignment]
        w.publisher = _Quiet()  # type: ignore[assignment]
        w.dead = _Dead()  # type: ignore[assignment]
        w._report = lambda force=False: None  # type: ignore[method-assign]
        serving = asyncio.create_task(w._serve())
        await asyncio.sleep(0.2)
        w.stop()
        await serving
        for t in w.tasks.values():
            t.cancel()

    asyncio.run(main())
    assert tasks.offset == taken and tasks.paused  # (4 + queued) // 4 tasks, then the partitions pause
    assert peak == 4  # still never more than max_episodes running


class _TopicPartition:
    def __init__(self, partition: int) -> None:
        self.partition = partition


def test_a_task_revoked_by_the_poll_that_fetched_it_gives_back_its_episodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second worker joining revokes partitions inside the first one's poll, after that poll
    handed over a task: the task is cancelled before its coroutine ever ran. Its episodes must still
    leave the worker's count, or a few such tasks fill max_episodes forever and the worker pauses its
    partitions for good (CI: guess_number hung at step 4)."""
    ran: list[int] = []

    async def episode(runtime: Any, task: Task, k: int, *rest: Any) -> tuple[list[Any], int]:
        ran.append(k)
        return [], 0

    monkeypatch.setattr(worker_mod, "run_episode", episode)
    w = _worker(tmp_path)
    w.runtime = type("R", (), {"resolve": staticmethod(lambda task: (None, None))})()

    class _Consumer:
        def commit(self, asynchronous: bool) -> None: ...

    async def main() -> None:
        w.loop = asyncio.get_running_loop()
        w.assigned = {0}
        w.dead = _Dead()  # type: ignore[assignment]
        task = Task(task_id="t0", env="arithmetic", roles={"solver": "policy"}, group_size=4)
        w._on_message(_Msg(encode(task), offset=0))  # fetched by a poll ...
        w._on_revoke(_Consumer(), [_TopicPartition(0)])  # ... whose rebalance revoked its partition
        for _ in range(3):
            await asyncio.sleep(0)

    asyncio.run(main())
    assert ran == []  # it never started: its new owner runs it
    assert w.counts["tasks_released"] == 1 and w.counts["tasks_done"] == 0
    assert w.pending_episodes == 0 and w.tasks == {}  # nothing held: the worker has room for new tasks


def test_a_tasks_trajectories_travel_as_one_record_per_group_split_at_the_byte_budget() -> None:
    from astraflow.records import batches
    from streams.testing import make_traj

    trajs = [make_traj("t0", i, group_size=5) for i in range(5)] + [make_traj("t1", 0, group_size=1)]
    size = len(encode(trajs[0]))
    [whole, other] = batches(trajs, max_bytes=1 << 20)
    assert (whole.group_id, len(whole.items), other.group_id, len(other.items)) == ("t0#0", 5, "t1#0", 1)
    assert whole.items == [encode(t) for t in trajs[:5]]
    split = batches(trajs[:5], max_bytes=2 * size)  # two fit in a record
    assert [len(b.items) for b in split] == [2, 2, 1] and {b.group_id for b in split} == {"t0#0"}
    assert [len(b.items) for b in batches(trajs[:2], max_bytes=size // 2)] == [1, 1]  # too big: alone


def test_a_groups_trajectories_go_together_but_never_wait_long_for_a_straggler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Episodes that end together go as one record; one that hangs (a tool call that never answers)
    holds the others back at most BATCH_WAIT_S, so streams can still emit the group at its timeout."""
    from streams.testing import make_traj

    async def episode(runtime: Any, task: Task, k: int, *rest: Any) -> tuple[list[Any], int]:
        if k == 3:
            await asyncio.Event().wait()  # never ends
        await asyncio.sleep(0.01 * k)
        return [make_traj("t0", k, group_size=4)], 5

    monkeypatch.setattr(worker_mod, "run_episode", episode)
    monkeypatch.setattr(batching, "BATCH_WAIT_S", 0.2)
    w = _worker(tmp_path)
    sent: list[list[str]] = []

    def publish(trajs: list[Any]) -> list[asyncio.Future[None]]:
        sent.append([t.traj_id for t in trajs])
        return [_acked(w.loop)]

    async def main() -> None:
        w.loop = asyncio.get_running_loop()
        w._publish = publish  # type: ignore[method-assign]
        w.tracker.start(0, 0)
        task = w._start(Task(task_id="t0", env="arithmetic", roles={"solver": "policy"}, group_size=4), 0, 0)
        await asyncio.sleep(0.1)
        assert sent == []  # the first three ended; they wait a little for the fourth
        await asyncio.sleep(0.3)
        assert sent == [["t0#0#0", "t0#0#1", "t0#0#2"]]  # together, without the straggler
        assert w.pending_episodes == 1 and w.running_episodes == 1
        task.cancel()  # its partition revoked: the straggler is cancelled, its slot given back
        await asyncio.sleep(0.05)

    asyncio.run(main())
    assert w.pending_episodes == 0 and w.running_episodes == 0 and w.tasks == {}


def test_the_serving_loop_slows_down_only_once_it_has_had_no_task_for_a_while() -> None:
    tick = worker_mod.serve_tick
    assert tick(busy=False, idle_for=0.0) == worker_mod.POLL_TICK_S  # a task just came
    assert tick(busy=True, idle_for=60.0) == worker_mod.POLL_TICK_S  # tasks in flight, however old
    assert tick(busy=False, idle_for=worker_mod.IDLE_AFTER_S) == worker_mod.IDLE_TICK_S
    assert worker_mod.IDLE_TICK_S > worker_mod.POLL_TICK_S


def test_an_idle_worker_looks_less_often_and_a_task_brings_the_fast_loop_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The serving loop's sleeps between passes: IDLE_TICK_S after a lull, POLL_TICK_S from the
    pass that takes a task on (its delivery acknowledgements and the next tasks are served at the
    fast rate)."""

    async def episode(*args: Any) -> tuple[list[Any], int]:
        await asyncio.Event().wait()  # still running when the loop stops
        return [], 0

    monkeypatch.setattr(worker_mod, "run_episode", episode)
    w = _worker(tmp_path)
    task = Task(task_id="t0", env="arithmetic", roles={"solver": "policy"}, group_size=4)
    polls = iter([None, None, _Msg(encode(task), offset=0)])

    class _Reader:
        def poll(self, timeout: float) -> _Msg | None:
            return next(polls, None)

        def assignment(self) -> list[int]:
            return [0]

        def pause(self, partitions: list[int]) -> None: ...  # the task fills max_episodes

    class _Quiet:
        def poll(self, timeout: float) -> None: ...

    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        if delay:
            slept.append(delay)
            if len(slept) == 4:
                w.stop()
        await real_sleep(0)

    async def main() -> None:
        w.loop = asyncio.get_running_loop()
        w.runtime = type("R", (), {"resolve": staticmethod(lambda task: (None, None))})()
        w.reader = w.consumer = _Reader()  # type: ignore[assignment]
        w.publisher = _Quiet()  # type: ignore[assignment]
        w.dead = _Dead()  # type: ignore[assignment]
        w._report = lambda force=False: None  # type: ignore[method-assign]
        w._last_task = worker_mod.time.monotonic() - 2 * worker_mod.IDLE_AFTER_S  # a lull
        monkeypatch.setattr(worker_mod.asyncio, "sleep", sleep)
        await w._serve()
        monkeypatch.undo()
        in_flight.extend(w.tasks)
        for t in w.tasks.values():
            t.cancel()

    in_flight: list[tuple[int, int]] = []
    asyncio.run(main())
    idle, fast = worker_mod.IDLE_TICK_S, worker_mod.POLL_TICK_S
    assert slept == [idle, idle, fast, fast]  # two empty passes, then the task, then its tasks in flight
    assert in_flight == [(0, 0)]  # the task taken, still running when the loop stopped


def test_every_group_of_a_task_goes_to_the_trajectories_partition_its_task_id_hashes_to() -> None:
    """Where streams keeps the task's statistics, which it then folds in without a hop through Kafka
    (streams/sink.py); with no partition count the producer picks by group_id, as before."""
    from astraflow.kafka import partition_for
    from streams.testing import make_traj

    sent: list[tuple[str, int]] = []

    class Publisher:
        def send(self, topic: str, record: Any, key: str, on_delivery: Any, partition: int = -1) -> int:
            sent.append((key, partition))
            return 0

    trajs = [make_traj(task, 0, attempt=a) for task in ("t0", "t1", "t2") for a in (0, 1)]

    async def main() -> None:
        batching.send_batches(Publisher(), asyncio.get_running_loop(), trajs, partitions=8)  # type: ignore[arg-type]
        batching.send_batches(Publisher(), asyncio.get_running_loop(), trajs[:1])  # type: ignore[arg-type]

    asyncio.run(main())
    want = [(f"{task}#{a}", partition_for(task, 8)) for task in ("t0", "t1", "t2") for a in (0, 1)]
    assert sent == [*want, ("t0#0", -1)]
    assert len({p for _, p in want}) > 1  # the tasks do spread over the partitions
