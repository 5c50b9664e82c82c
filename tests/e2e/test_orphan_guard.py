"""A supervised component whose supervisor died (SIGKILL) must not outlive it for long, even when
its graceful stop hangs (the broker died too): it exits on its own after a grace period."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from astraflow.runner.supervisor import SUPERVISOR_ENV, exit_when_orphaned
from tests.conftest import subprocess_env

CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from astraflow.runner.supervisor import exit_when_orphaned
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a graceful stop that never ends
    assert exit_when_orphaned(grace_s=1.0, interval_s=0.1) is not None
    open(sys.argv[1], "w").write(str(os.getpid()))
    time.sleep(600)
""")

PARENT = textwrap.dedent("""
    import os, subprocess, sys, time
    env = dict(os.environ, {env}=str(os.getpid()))
    subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], env=env)
    time.sleep(600)
""").format(env=SUPERVISOR_ENV)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def test_an_orphaned_component_exits_after_the_grace_period(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(pid_file)], env=subprocess_env())
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and parent.poll() is None, "the child never started"
            time.sleep(0.1)
        child = int(pid_file.read_text())
        time.sleep(1.5)
        assert alive(child), "the guard must leave a supervised child alone while its supervisor lives"
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 20
        while alive(child):
            assert time.monotonic() < deadline, "the orphaned child is still running"
            time.sleep(0.1)
    finally:
        if parent.poll() is None:
            parent.kill()


def test_the_guard_ignores_processes_the_supervisor_did_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SUPERVISOR_ENV, str(os.getppid() + 1))  # not our parent: a grandchild
    assert exit_when_orphaned() is None
    monkeypatch.delenv(SUPERVISOR_ENV)
    assert exit_when_orphaned() is None


def test_a_stall_asks_each_running_component_for_its_thread_stacks(tmp_path: Path) -> None:
    """The stall detector's `Supervisor.dump_stacks`: every running component prints all its
    threads' stacks to its log (stderr), and says where it waits; one already gone is skipped."""
    from astraflow.runner.supervisor import Component, Supervisor

    child = textwrap.dedent("""
        import sys, threading, time
        from astraflow.runner.supervisor import dump_stacks_on_signal
        dump_stacks_on_signal()
        def wait_for_samples():
            time.sleep(600)
        threading.Thread(target=wait_for_samples, daemon=True).start()
        print("ready", flush=True)
        time.sleep(600)
    """)
    sup = Supervisor(tmp_path, env=subprocess_env())
    live = Component("trainer-solver", [], stage=0)
    live.proc = subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env()
    )
    gone = Component("feeder", [], stage=0)
    gone.proc = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.proc.wait()
    sup.components = [live, gone]
    try:
        assert live.proc.stdout is not None and live.proc.stdout.readline() == b"ready\n"
        assert sup.dump_stacks() == ["trainer-solver"]
        time.sleep(1.0)
    finally:
        live.proc.kill()
    err = live.proc.communicate(timeout=30)[1].decode()
    assert "(most recent call first)" in err and "in wait_for_samples" in err, err


def test_a_finished_run_stops_every_stage_at_once(tmp_path: Path) -> None:
    """`stop_all(together=True)` (a run that reached its steps) sends every SIGTERM before it waits
    for any exit: each child here holds its stop until all three have been asked to stop; stopped
    stage by stage, the second SIGTERM would never come."""
    import threading

    from astraflow.runner.supervisor import Component, Supervisor

    child = textwrap.dedent("""
        import os, signal, sys, time
        marks, name = sys.argv[1], sys.argv[2]
        def stop(*_):
            open(os.path.join(marks, name), "w").close()
            while len(os.listdir(marks)) < 3:  # every stage asked before any exits
                time.sleep(0.02)
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        print("ready", flush=True)
        time.sleep(600)
    """)
    marks = tmp_path / "marks"
    marks.mkdir()
    sup = Supervisor(tmp_path, env=subprocess_env())
    for stage, name in enumerate(("trainer-solver", "streams", "feeder")):
        c = Component(name, [], stage=stage, stop_timeout_s=60)
        c.proc = subprocess.Popen(
            [sys.executable, "-c", child, str(marks), name],
            stdout=subprocess.PIPE,
            env=subprocess_env(),
            start_new_session=True,
        )
        sup.components.append(c)
    for c in sup.components:
        assert c.proc is not None and c.proc.stdout is not None and c.proc.stdout.readline() == b"ready\n"
    stopper = threading.Thread(target=sup.stop_all, kwargs={"together": True}, daemon=True)
    stopper.start()
    stopper.join(30)
    try:
        assert not stopper.is_alive(), f"stop_all waited on one stage: asked {sorted(os.listdir(marks))}"
        assert sorted(os.listdir(marks)) == ["feeder", "streams", "trainer-solver"]
        assert [c.exit_code for c in sup.components] == [0, 0, 0]
    finally:
        for c in sup.components:
            if c.proc is not None:
                c.proc.kill()


def test_start_all_starts_only_what_is_not_started_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`astraflow run` starts its components while its broker boots, then calls start_all again
    once the topics are there (the only call on a secured or configured broker): none twice."""
    from astraflow.runner.supervisor import Component, Supervisor

    sup = Supervisor(tmp_path, env=subprocess_env())
    spawned: list[str] = []

    def spawn(c: Component) -> None:
        spawned.append(c.name)
        c.started_at = time.time()

    monkeypatch.setattr(sup, "_spawn", spawn)
    for stage, name in enumerate(("trainer-solver", "streams")):
        sup.add(Component(name, [], stage=stage))
    sup.start_all()
    sup.add(Component("feeder", [], stage=3))
    sup.start_all()
    assert spawned == ["trainer-solver", "streams", "feeder"]


def test_exit_now_keeps_what_the_component_wrote(tmp_path: Path) -> None:
    """A component ends with os._exit once its service returned: its buffered output and log lines
    are flushed first, and its exit status is kept; the interpreter's teardown is skipped."""
    child = textwrap.dedent("""
        import atexit, logging, sys
        from astraflow.runner.supervisor import exit_now
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
        atexit.register(lambda: print("teardown ran", flush=True))
        logging.getLogger("c").info("logged before exit")
        sys.stdout.write("fed 12 tasks")  # no newline, no flush: still in the buffer
        exit_now(3)
    """)
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, env=subprocess_env(), timeout=60
    )
    assert out.returncode == 3
    assert out.stdout == "fed 12 tasks" and "logged before exit" in out.stderr


def test_wait_for_exit_returns_when_a_component_exits(tmp_path: Path) -> None:
    from astraflow.runner.supervisor import Component, Supervisor

    c = Component("trainer-solver", [], stage=0)
    c.proc = subprocess.Popen([sys.executable, "-c", "pass"], env=subprocess_env())
    c.proc.wait()
    started = time.monotonic()
    Supervisor.wait_for_exit([c], 120)
    assert time.monotonic() - started < 60  # not its whole timeout
