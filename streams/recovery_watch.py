"""Ends a streams worker whose table recovery has stopped reading, so that it is restarted.

faust 0.15.3 can wait for ever for changelog records that never arrive: after a second worker
joined and then left while data flowed, the first worker's recovery of the partitions it took back
logged "No event received for active tp ...-changelog" every 5 s for minutes, in 4 of 22 tries
(2026-12-07), and its groups waited. A fresh process recovers the same partitions from the
changelogs (every crash test restarts so). So once the recovery has records left to read and has
read none for `stall_s`, `RecoveryWatch` names the partitions, logs the error and ends the process
with EX_SOFTWARE; `astraflow run` (or the deployment's restart policy) starts it again. Nothing
is lost by that: a record's offset is committed only once it is processed, a held group's record
only once its group is done (streams/runtime.py), and the emission protocol makes the restart
exactly-once (streams/emit.py).

Fault injection for the tests: ASTRAFLOW_STREAMS_FAILPOINT=stall_recovery:1 drops every changelog
record delivered during the worker's recoveries, as that stall did (`inject_stall`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from astraflow.errors import AstraFlowError


class RecoveryStalled(AstraFlowError):
    """faust's table recovery stopped reading its changelogs."""


class RecoveryWatch:
    """Looks at the faust app's `Recovery` service (`app.tables.recovery`) at each `check(now)`."""

    def __init__(self, app: Any, stall_s: float, on_stall: Callable[[str], None]) -> None:
        self.app = app
        self.stall_s = stall_s
        self.on_stall = on_stall
        self._since: tuple[float, dict[Any, int]] | None = None  # when the read offsets last moved

    def check(self, now: float) -> None:
        rec = self.app.tables.recovery
        remaining = {tp: n for tp, n in rec.active_remaining().items() if n > 0} if rec.in_recovery else {}
        if not remaining:
            self._since = None
            return
        offsets = dict(rec.active_offsets)
        if self._since is None or self._since[1] != offsets:
            self._since = (now, offsets)
            return
        if now - self._since[0] < self.stall_s:
            return
        stuck = ", ".join(
            f"{tp.topic}[{tp.partition}] at {offsets.get(tp)} of {rec.active_highwaters.get(tp)}"
            for tp in sorted(remaining, key=lambda tp: (tp.topic, tp.partition))
        )
        self.on_stall(
            f"the table recovery has read no changelog record for {now - self._since[0]:.0f} s with "
            f"{sum(remaining.values())} left to read ({stuck}); exiting to be restarted"
        )


def inject_stall(app: Any) -> None:
    """The stall_recovery failpoint: changelog records delivered while the worker recovers are dropped
    (faust's conductor hands them to the changelog queue with `put_nowait_enhanced`, or `put` when
    it is full)."""
    queue = app.tables.changelog_queue
    put, put_nowait = queue.put, queue.put_nowait_enhanced

    def recovering() -> bool:
        return bool(app.tables.recovery.in_recovery)

    async def put_unless_recovering(*args: Any, **kwargs: Any) -> None:
        if not recovering():
            await put(*args, **kwargs)

    def put_nowait_unless_recovering(*args: Any, **kwargs: Any) -> None:
        if not recovering():
            put_nowait(*args, **kwargs)

    queue.put = put_unless_recovering
    queue.put_nowait_enhanced = put_nowait_unless_recovering
