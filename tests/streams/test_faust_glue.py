"""The overrides of faust's private code (streams/faust_glue.py): the worker the streams CLI runs
leaves the root logger at the requested level and tells a stop's race from a crash, and the app
refuses releases the overrides were not checked against."""

from __future__ import annotations

import logging

import faust
import pytest
from faust.exceptions import NotReady

from astraflow.errors import ConfigError
from streams.faust_glue import LEANED_ON, AstraFaustApp, QuietWorker, check_versions, is_stop_race


@pytest.fixture
def root_logging():
    root = logging.getLogger()
    saved = root.level, list(root.handlers)
    yield root
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]


def _root_level_after_setup(worker_cls: type, root: logging.Logger) -> int:
    app = faust.App("test-faust-glue", broker="kafka://127.0.0.1:1")
    worker = worker_cls(app, loglevel="warn", quiet=True)
    worker._setup_logging()
    return root.level


def test_plain_faust_worker_turns_debug_on(root_logging):
    # what QuietWorker exists for: if faust stops doing this, QuietWorker can go
    assert _root_level_after_setup(faust.Worker, root_logging) == logging.DEBUG


def test_quiet_worker_keeps_the_requested_level(root_logging):
    assert _root_level_after_setup(QuietWorker, root_logging) == logging.WARNING
    assert not logging.getLogger("aiokafka").isEnabledFor(logging.DEBUG)


def test_quiet_worker_logs_under_the_worker_label(caplog):
    # "[^Worker]: Ready" is the line the streams harnesses and operators wait for
    app = faust.App("test-faust-glue-label", broker="kafka://127.0.0.1:1")
    worker = QuietWorker(app, loglevel="warn", quiet=True)
    with caplog.at_level(logging.INFO):
        worker.log.info("Ready")
    assert "[^Worker]: Ready" in caplog.text


def test_quiet_worker_exits_without_modes_closing_second():
    """mode's loop shutdown ends on `_sentinel_task`, a 1 s sleep after the app has stopped and
    committed: QuietWorker's completes without suspending (if mode stops calling it, this goes)."""
    import inspect

    import mode

    assert "_sentinel_task" in inspect.getsource(mode.Worker._shutdown_loop)
    app = faust.App("test-faust-glue-exit", broker="kafka://127.0.0.1:1")
    worker = QuietWorker(app, loglevel="warn", quiet=True)
    coro = worker._sentinel_task()
    with pytest.raises(StopIteration):  # finished at its first step: no sleep to wait on
        coro.send(None)


def test_an_error_while_the_app_stops_ends_the_task_quietly_and_any_other_stops_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A task still emitting when streams is stopped meets a stopped producer (faust's NotReady): that is
    the stop, not a failure (the run's exit code would say it failed); the same error while running is
    fatal, exit code 70."""
    import types

    from streams import runtime

    exits: list[int] = []
    monkeypatch.setattr(runtime.os, "_exit", exits.append)
    monkeypatch.setattr(runtime.logging, "shutdown", lambda: None)  # this process's logging stays up
    runtime.fatal(types.SimpleNamespace(should_stop=True), "the group emitter", RuntimeError("x"))
    assert exits == []
    runtime.fatal(types.SimpleNamespace(should_stop=False), "the group emitter", RuntimeError("x"))
    assert exits == [runtime.EX_SOFTWARE]


def test_the_installed_faust_and_aiokafka_are_ones_the_overrides_were_checked_against():
    check_versions()  # what create_app runs first


@pytest.mark.parametrize(
    ("installed", "named"),
    [
        ({"faust-streaming": "0.16.0"}, "faust-streaming 0.16.0"),
        ({"mode-streaming": "0.8.0"}, "mode-streaming 0.8.0"),
        ({"aiokafka": "0.15.1"}, "aiokafka 0.15.1"),
    ],
)
def test_another_release_is_refused_by_name(installed, named):
    with pytest.raises(ConfigError, match=named):
        check_versions(installed)


def test_a_release_without_a_private_method_an_override_relies_on_is_refused_by_name():
    class Consumer:  # a release whose consumer moved `_new_offset`
        pass

    with pytest.raises(ConfigError, match=r"test_faust_glue\..*Consumer\._new_offset is gone"):
        check_versions(leaned_on=(*LEANED_ON, (Consumer, "_new_offset")))


def _worker_that_crashed(stopping: bool, reason: BaseException) -> QuietWorker:
    app = faust.App("test-faust-glue-stop", broker="kafka://127.0.0.1:1")
    worker = QuietWorker(app, loglevel="warn", quiet=True)
    if stopping:
        worker._stopped.set()  # what mode's stop() sets first
    worker._crash(reason)
    return worker


@pytest.mark.parametrize(
    "reason",
    [NotReady("Producer service not yet started"), RuntimeError("Cannot flush: Producer not Running")],
)
def test_the_producer_stopping_under_a_sending_buffer_is_no_crash_of_a_stop(reason):
    import asyncio

    worker = _worker_that_crashed(True, reason)
    asyncio.run(worker._sentinel_task())
    assert worker.crash_reason is None  # the worker exits 0: the stop's own race


@pytest.mark.parametrize(
    ("stopping", "reason"),
    [(False, NotReady("not started")), (True, RuntimeError("boom")), (True, KeyError("x"))],
)
def test_a_real_crash_still_fails_the_worker(stopping, reason):
    import asyncio

    worker = _worker_that_crashed(stopping, reason)
    asyncio.run(worker._sentinel_task())
    assert worker.crash_reason is reason
    assert is_stop_race(reason) == (isinstance(reason, NotReady))


@pytest.mark.parametrize("buffer_cls", ["faust", "ours"])
def test_a_drain_waits_for_the_table_write_the_buffers_task_still_holds(buffer_cls):
    """faust's buffer task takes a message off the queue, then awaits handing it to aiokafka: its
    flush, which waits for the queue only, returns with the write still in that task's hands (a
    `send_now` then closed aiokafka's batches without it, which sat out the linger). `drain` waits
    for it; if faust's flush ever waits for it too, this test says so."""
    import asyncio
    from types import SimpleNamespace

    from faust.transport.producer import ProducerBuffer

    from streams.faust_glue import _DrainableBuffer

    handed: list[object] = []

    class Channel:
        async def publish_message(self, fut: object, wait: bool = False) -> None:
            await asyncio.sleep(0.05)  # aiokafka waiting on metadata or a full batch
            handed.append(fut)

    async def main() -> None:
        buf = (_DrainableBuffer if buffer_cls == "ours" else ProducerBuffer)()
        buf.app = SimpleNamespace(conf=SimpleNamespace(producer_threaded=False))
        await buf.start()
        try:
            write = SimpleNamespace(message=SimpleNamespace(channel=Channel()))
            buf.put(write)
            await asyncio.sleep(0.01)  # the buffer's task has taken it: the queue is empty
            assert buf.size == 0 and handed == []
            if buffer_cls == "ours":
                await buf.drain()
                assert handed == [write]
            else:
                await buf.flush()
                assert handed == []  # faust's flush returned without it
        finally:
            await buf.stop()

    asyncio.run(main())


def test_the_worker_consumer_fetches_with_the_apps_wait_not_fausts_1500_ms():
    """faust 0.15.3 hard-codes fetch_max_wait_ms=1500; streams' consumer takes the app's
    (streams.fetch_max_wait_ms), or aiokafka's own when the app names none."""
    import asyncio

    async def waits() -> tuple[int, int]:
        made = []
        for i, wait in enumerate((20, None)):
            app = AstraFaustApp(f"fetch-wait-{i}", broker="kafka://127.0.0.1:1", store="memory://")
            if wait is not None:
                app.fetch_max_wait_ms = wait
            consumer = app.consumer._thread._create_worker_consumer(app.transport)
            made.append(consumer._fetch_max_wait_ms)
            await consumer.stop()  # never started: nothing to close but the object
        return made[0], made[1]

    assert asyncio.run(waits()) == (20, 1500)
