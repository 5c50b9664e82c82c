"""Sandboxed execution of model-written Python for the `code` environment.

Defence in depth, because the code is untrusted, and the untrusted process is never trusted to judge:
- isolation (`sandbox_isolation.py`): bubblewrap gives the child a read-only root with only the
  interpreter, a tmpfs home, no network, its own pid/IPC/UTS namespaces, no capabilities and (on
  x86-64) a seccomp filter; where
  bwrap cannot run, a loud warning and `isolation="none"` on the result, and the child runs as before
  (a temporary directory, an empty environment, a new session);
- inside the child (`sandbox_harness.py`): rlimits on CPU time, address space, file size, open files
  and processes, the uid nobody when the worker runs as root, and an audit hook that ends the process
  on fork/exec/subprocess, sockets, ctypes, signals, or writes outside its directory;
- judging (`sandbox_judge.py`): the child gets only the test inputs and writes its results as plain
  JSON lines; this process parses them and compares them with the expected values with exact type
  checks, so `__eq__` overrides, int/str subclasses, frame walking and forged verdicts get nothing;
- outside it: a wall-clock limit, then SIGKILL of the whole process group (and with bwrap, of the pid
  namespace); the output is read through a bounded pipe; the directory is removed afterwards.
A program that loops, allocates 10 GB, forks without end, opens sockets, writes outside its directory
or forges its results gets reward 0 with the reason; the worker is unharmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from workers.envs.sandbox_isolation import HARNESS_AT, bwrap_argv, probe, python, seccomp_fd
from workers.envs.sandbox_judge import judge, plain

#: bubblewrap or not (`run_tests`, the `code` environment's argument)
Isolation = Literal["auto", "bwrap", "none"]

HARNESS = Path(__file__).with_name("sandbox_harness.py")
NOBODY = 65534


@dataclass(frozen=True)
class Limits:
    cpu_s: float = 2.0
    memory_mb: int = 256
    wall_s: float = 5.0
    fsize_mb: int = 1
    nofile: int = 32
    nproc: int = 64
    output_bytes: int = 65536


@dataclass
class SandboxResult:
    passed: int
    total: int
    reason: str | None = None
    wall_s: float = 0.0
    network: str | None = None
    isolation: str = "none"
    """"bwrap" when the child ran in bubblewrap's namespaces, "none" when it ran unisolated."""

    @property
    def score(self) -> float:
        return self.passed / self.total if self.total else 0.0


async def _read_bounded(stream: asyncio.StreamReader, limit: int) -> bytes:
    buf = b""
    while len(buf) <= limit:
        chunk = await stream.read(4096)
        if not chunk:
            break
        buf += chunk
    return buf


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def run_tests(
    source: str,
    func: str,
    tests: list[list[Any]],
    limits: Limits = Limits(),
    isolation: Isolation = "auto",
) -> SandboxResult:
    """Run `func` of `source` on each (args, expected) of `tests` in the sandbox; judge it here.

    `isolation`: "auto" uses bubblewrap when it works here and falls back (warning once) when not;
    "bwrap" scores 0 with the reason instead of falling back; "none" never uses it.
    """
    start = time.monotonic()
    total = len(tests)
    why_not = probe(HARNESS) if isolation != "none" else "isolation='none'"
    if why_not is not None and isolation == "bwrap":
        return SandboxResult(0, total, f"isolation required but unavailable: {why_not}", 0.0)
    isolated = why_not is None
    home = None if isolated else tempfile.mkdtemp(prefix="astraflow-sandbox-")
    try:
        expected = [plain(want) for _, want in tests]
        job = json.dumps(
            {
                "source": source,
                "func": func,
                "inputs": [args for args, _ in tests],
                "isolated": isolated,
                "limits": {
                    "cpu_s": limits.cpu_s,
                    "memory_mb": limits.memory_mb,
                    "fsize_mb": limits.fsize_mb,
                    "nofile": limits.nofile,
                    "nproc": limits.nproc,
                },
            }
        ).encode()
        fd = seccomp_fd() if isolated else None
        if isolated:
            argv, cwd = [*bwrap_argv(HARNESS, fd), HARNESS_AT], None
        else:
            assert home is not None
            if os.getuid() == 0:
                os.chown(home, NOBODY, NOBODY)
            os.chmod(home, 0o700)
            argv, cwd = [python(), "-I", "-S", str(HARNESS)], home
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                cwd=cwd,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                start_new_session=True,
                pass_fds=() if fd is None else (fd,),
            )
        finally:
            if fd is not None:
                os.close(fd)
        assert proc.stdin is not None and proc.stdout is not None
        timed_out = False
        try:
            proc.stdin.write(job)
            await proc.stdin.drain()
            proc.stdin.close()
            out = await asyncio.wait_for(_read_bounded(proc.stdout, limits.output_bytes), limits.wall_s)
            await asyncio.wait_for(proc.wait(), max(0.1, limits.wall_s - (time.monotonic() - start)))
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            timed_out = True
            out = b""
        finally:
            _kill_group(proc.pid)  # also ends anything the program left behind in its group
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        wall = time.monotonic() - start
        mode = "bwrap" if isolated else "none"
        if timed_out:
            return SandboxResult(0, total, f"wall-clock limit of {limits.wall_s}s", wall, isolation=mode)
        verdict = judge(out, expected, limits.output_bytes)
        if verdict.complete:
            return SandboxResult(verdict.passed, total, verdict.reason, wall, verdict.network, mode)
        rc = proc.returncode
        if verdict.reason and verdict.reason.startswith("malformed"):
            why = verdict.reason
        elif rc is not None and (rc < 0 or (isolated and rc > 128)):
            rc = -rc if rc < 0 else rc - 128  # bwrap exits 128 + the signal that killed the child
            name = signal.Signals(rc).name if rc in signal.Signals._value2member_map_ else str(rc)
            why = "CPU time limit" if rc == signal.SIGXCPU else f"killed by {name}"
        else:
            why = f"exited with status {rc} before reporting every result"
        return SandboxResult(0, total, why, wall, verdict.network, mode)
    finally:
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)
