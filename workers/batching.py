"""How a worker sends a task's trajectories to `trajectories`: together, in as few TrajectoryBatch
records as fit (the streams worker's cost is per record), without holding a finished episode back
more than `BATCH_WAIT_S` for a straggler (a hung tool call must not hold back its group's other
members: streams emits a group that misses some at its timeout).

`send_as_they_end` gathers the episodes' trajectories in time, `send_batches` packs them by size
and produces them; each record's future is settled by the broker's acknowledgement, which the
worker waits for before it stores the task's offset.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from astraflow.kafka import Publisher, partition_for
from astraflow.records import Trajectory, batches

#: The most encoded trajectories one record of `trajectories` carries (the topic takes 16 MiB): a
#: group's trajectories travel together, since the streams worker's cost is per record.
BATCH_BYTES = 1 << 20
#: ... and wait at most this long for the rest of their group (see send_as_they_end)
BATCH_WAIT_S = 2.0


async def send_as_they_end(
    running: set[asyncio.Task[list[Trajectory]]],
    publish: Callable[[list[Trajectory]], list[asyncio.Future[None]]],
) -> list[asyncio.Future[None]]:
    """Send the trajectories of the `running` episodes with `publish` as they end; the broker's
    acknowledgements. Trajectories go together (one record per group), except that none waits more
    than BATCH_WAIT_S for the rest. Episodes still running when this ends (cancelled) are cancelled."""
    acks: list[asyncio.Future[None]] = []
    ended: list[Trajectory] = []
    since = 0.0
    try:
        while running:
            wait = max(0.0, since + BATCH_WAIT_S - time.monotonic()) if ended else None
            done, running = await asyncio.wait(running, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            for episode in done:
                since = since if ended else time.monotonic()
                ended += episode.result()
            if ended and (not running or time.monotonic() - since >= BATCH_WAIT_S):
                acks += publish(ended)
                ended = []
    finally:
        for episode in running:
            episode.cancel()
    return acks


def send_batches(
    publisher: Publisher, loop: asyncio.AbstractEventLoop, trajs: list[Trajectory], partitions: int = 0
) -> list[asyncio.Future[None]]:
    """Send trajectories in as few records as fit (`batches`); a future per record, settled on
    `loop` by the broker's acknowledgement (or its refusal).

    Each record goes to the partition of `trajectories` that its task_id hashes to among
    `partitions` (0: the producer's choice by group_id): every group of a task, each attempt, then
    lands where streams keeps that task's statistics, and is folded into them without a hop through
    Kafka (streams/sink.py, `KafkaSink.send_summary`)."""

    def settle(fut: asyncio.Future[None], exc: Exception | None) -> None:
        if not fut.done():
            fut.set_result(None) if exc is None else fut.set_exception(exc)

    def on_delivery(fut: asyncio.Future[None]) -> Callable[[Exception | None], None]:
        def delivered(exc: Exception | None) -> None:  # on the producer's thread: settle on the loop
            loop.call_soon_threadsafe(settle, fut, exc)

        return delivered

    tasks = {traj.group_id: traj.task_id for traj in trajs}
    futures: list[asyncio.Future[None]] = []
    for batch in batches(trajs, BATCH_BYTES):
        futures.append(loop.create_future())
        part = partition_for(tasks[batch.group_id], partitions) if partitions else -1
        publisher.send(
            "trajectories", batch, key=batch.group_id, on_delivery=on_delivery(futures[-1]), partition=part
        )
    return futures
