"""Process supervision for `astraflow run`: start components as child processes, restart the ones
that crash, and stop everything in order.

Each component is an `astraflow <command>` child in its own session (so a terminal Ctrl-C reaches
only the supervisor, which then stops children in order) with PR_SET_PDEATHSIG, so that even a
SIGKILL of the supervisor leaves no orphan behind. Output goes to `<run_dir>/logs/<name>.log`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from astraflow.broker.jvm import die_with_parent_signal

log = logging.getLogger(__name__)

SUPERVISOR_ENV = "ASTRAFLOW_SUPERVISOR_PID"
ORPHAN_GRACE_S = 30.0


def exit_when_orphaned(grace_s: float = ORPHAN_GRACE_S, interval_s: float = 0.5) -> threading.Thread | None:
    """In a supervised component: once the supervisor is gone, give the graceful stop that its
    PR_SET_PDEATHSIG SIGTERM started `grace_s` seconds, then exit hard. Nobody else will: the
    supervisor that would have sent SIGKILL after the grace period is dead, and the broker usually
    died with it, so a graceful stop that waits on Kafka would wait forever. Only for a direct child
    of the supervisor (a grandchild with the same environment is left alone)."""
    supervisor = os.environ.get(SUPERVISOR_ENV, "")
    if not supervisor.isdigit() or os.getppid() != int(supervisor):
        return None

    def watch() -> None:
        while os.getppid() == int(supervisor):
            time.sleep(interval_s)
        time.sleep(grace_s)
        sys.stderr.write(
            f"astraflow: the supervisor (PID {supervisor}) is gone and this process did not stop "
            f"within {grace_s:.0f}s: exiting\n"
        )
        sys.stderr.flush()
        os._exit(1)

    thread = threading.Thread(target=watch, name="orphan-guard", daemon=True)
    thread.start()
    return thread


#: A supervised component prints every thread's Python stack to its log on this signal; the stall
#: detector sends it, so a hang says where each process waits (the trainer of a CI fault run stalled
#: with complete groups queued, and nothing told which call it was in).
STACKS_SIGNAL = signal.SIGUSR1


def exit_now(code: int = 0) -> NoReturn:
    """End a component whose service has returned (or `astraflow run`, its report written): logs and
    stdio flushed, then `os._exit`, without the interpreter's teardown. Measured: a trainer took ~1 s
    from its last checkpoint to its exit (librdkafka clients' and torch's destructors, thread joins),
    and the end of every run waited for it. Nothing that teardown does is needed by then: the services
    flush their records, commit their offsets and sync their checkpoints before they return."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def dump_stacks_on_signal() -> None:
    """In a component: print every thread's stack to stderr (its log) on STACKS_SIGNAL. Faust's
    worker replaces the handler with its own, which logs its asyncio tasks' stacks instead."""
    import faulthandler

    faulthandler.register(STACKS_SIGNAL, all_threads=True)


@dataclass
class Component:
    """One supervised child: `astraflow <args>`."""

    name: str
    args: list[str]
    stage: int
    """Start order (low first); stop order is the reverse."""
    restart: bool = True
    """Restart on a crash. A clean exit (status 0) is never restarted: it means "done"."""
    stop_timeout_s: float = 60.0
    """Grace period after SIGTERM before SIGKILL."""
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0
    exit_code: int | None = None
    started_at: float = 0.0
    crashes: list[tuple[float, int]] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Supervisor:
    """Starts components in stage order, restarts crashes with backoff, stops in reverse order."""

    def __init__(
        self,
        run_dir: Path,
        env: dict[str, str],
        max_restarts: int = 20,
        on_event: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.run_dir = run_dir
        self.logs = run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = env
        self.max_restarts = max_restarts
        self.components: list[Component] = []
        self.on_event = on_event
        self.stopping = False

    def dump_stacks(self) -> list[str]:
        """Ask every running component to print its threads' stacks to its log; their names."""
        asked = []
        for c in self.components:
            if c.proc is not None and c.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c.proc.pid, STACKS_SIGNAL)
                    asked.append(c.name)
        return asked

    def add(self, component: Component) -> None:
        self.components.append(component)

    def _spawn(self, c: Component) -> None:
        env = {**self.env, **c.env, SUPERVISOR_ENV: str(os.getpid())}
        logfile = open(self.logs / f"{c.name}.log", "ab")  # noqa: SIM115 - owned by the child from here
        logfile.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} astraflow {' '.join(c.args)}\n".encode())
        logfile.flush()
        c.proc = subprocess.Popen(
            [sys.executable, "-m", "astraflow.cli", *c.args],
            stdout=logfile,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=os.getcwd(),
            start_new_session=True,
            preexec_fn=die_with_parent_signal,
        )
        logfile.close()
        c.started_at = time.time()
        c.exit_code = None

    def start_all(self) -> None:
        """Start every component not started yet, stage by stage."""
        for c in sorted(self.components, key=lambda c: c.stage):
            if c.started_at:
                continue
            self._spawn(c)
            self.on_event(f"started {c.name} (PID {c.proc.pid if c.proc else '?'})")

    def poll(self) -> list[Component]:
        """Reap exits; restart crashed components whose backoff has passed. Returns the components
        that exited cleanly during this poll."""
        done = []
        now = time.time()
        for c in self.components:
            if c.proc is None:
                if c.exit_code is None and now >= c.next_start and not self.stopping:
                    self._spawn(c)
                    self.on_event(f"restarted {c.name} (restart {c.restarts})")
                continue
            code = c.proc.poll()
            if code is None:
                continue
            c.exit_code = code
            c.proc = None
            if code == 0 or self.stopping:
                done.append(c)
                continue
            c.crashes.append((now, code))
            tail = _tail(self.logs / f"{c.name}.log")
            if not c.restart or c.restarts >= self.max_restarts:
                self.on_event(f"{c.name} failed with status {code}; not restarting. Log tail:\n{tail}")
                continue
            c.restarts += 1
            backoff = min(30.0, 2.0 ** min(c.restarts - 1, 5))
            c.next_start = now + backoff
            c.exit_code = None
            self.on_event(
                f"{c.name} crashed with status {code}; restarting in {backoff:.0f}s. Log tail:\n{tail}"
            )
        return done

    @staticmethod
    def wait_for_exit(components: list[Component], timeout_s: float, interval_s: float = 0.05) -> None:
        """Sleep `timeout_s`, or less: until one of `components` has exited (to be reaped by `poll`)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(c.proc is not None and c.proc.poll() is not None for c in components):
                return
            time.sleep(min(interval_s, max(0.0, deadline - time.monotonic())))

    def failed(self) -> list[Component]:
        """Components that crashed and will not be restarted."""
        return [c for c in self.components if c.proc is None and c.exit_code not in (None, 0)]

    def stop_all(self, together: bool = False) -> None:
        """Stop components in reverse stage order: SIGTERM, wait, SIGKILL. Idempotent. `together`:
        every component at once (a finished run: nothing downstream is waited for any more; each one
        still drains and commits on its own, as it does for any SIGTERM), ~2 s sooner than by stage."""
        self.stopping = True
        stage_of: Callable[[Component], int] = (lambda c: 0) if together else (lambda c: c.stage)
        for stage in sorted({stage_of(c) for c in self.components}, reverse=True):
            group = [c for c in self.components if stage_of(c) == stage and c.running]
            for c in group:
                assert c.proc is not None  # running
                self.on_event(f"stopping {c.name}")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.proc.pid, signal.SIGTERM)
            deadline = time.time() + max((c.stop_timeout_s for c in group), default=0)
            for c in group:
                assert c.proc is not None
                try:
                    c.exit_code = c.proc.wait(timeout=max(0.1, deadline - time.time()))
                    if c.exit_code == -signal.SIGTERM:  # ours, before it installed its handler (starting up):
                        c.exit_code = 0  # a clean stop, not a failure (the run exited 1 for it)
                except subprocess.TimeoutExpired:
                    self.on_event(f"{c.name} did not stop in {c.stop_timeout_s:.0f}s; killing it")
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(c.proc.pid, signal.SIGKILL)
                    c.exit_code = c.proc.wait()
                # Anything the component left in its process group goes too.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.proc.pid, signal.SIGKILL)
                c.proc = None

    def kill_all(self) -> None:
        """Immediate SIGKILL of everything (second Ctrl-C)."""
        self.stopping = True
        for c in self.components:
            if c.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.proc.pid, signal.SIGKILL)
                c.proc.wait()
                c.proc = None


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
