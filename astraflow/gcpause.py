"""Python's cyclic garbage collector in the long-running components.

A component imports torch and transformers, or Faust, at start: ~400,000 objects that live as long
as the process. A full collection walks every one of them (~190 ms on the 2-core machine of
bench/RESULTS.md), and the imports alone trigger several: a trainer spent 1.2 s of CPU in 7 full
collections before its first step, a worker 1.0 s in 7, on 2 cores that all the components share
while they start; a full collection then came every ~25 s in both, and every ~4 s in streams.

So `astraflow.cli.main` starts the long-running components (`LONG_RUNNING`) with the collector
paused, and each of them calls `settle` once it is built: everything alive then goes into the
permanent generation (`gc.freeze`, never walked again) and the collector runs again, over what
came after. Nothing is freed later than before except garbage in reference cycles created while
paused, which the start does not make much of. In any other process (a test calling a component in
process) `settle` does nothing."""

from __future__ import annotations

import gc

#: the commands of `astraflow` that run until stopped and call `settle` once built
LONG_RUNNING = frozenset({"trainer", "worker", "streams", "feed", "run"})

_paused = False


def pause(command: str | None) -> None:
    """Pause the collector if `command` is one of the long-running components."""
    global _paused
    if command in LONG_RUNNING and gc.isenabled():
        gc.disable()
        _paused = True


def settle() -> None:
    """The component is built: freeze what is alive and run the collector again (once; a no-op
    unless `pause` paused it)."""
    global _paused
    if not _paused:
        return
    _paused = False
    gc.freeze()
    gc.enable()
