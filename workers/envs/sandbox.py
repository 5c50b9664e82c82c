"""Sandboxed execution of model-written Python for the `code` environment.

Defence in depth, because the code is untrusted:
- a fresh child interpreter (`python -I -S`, standard library only) in its own session, in a private
  temporary directory, with an empty environment;
- inside it (`sandbox_harness.py`), before the untrusted code runs: a new network namespace when
  permitted (else sockets are blocked by the audit hook alone), rlimits on CPU time, address space,
  file size, open files and processes, an unprivileged uid (nobody) when the worker runs as root, and
  an audit hook that kills the process on fork/exec/subprocess, sockets, ctypes, signals, or writes
  outside the directory;
- outside it: a wall-clock limit, then SIGKILL of the whole process group; the verdict is read from a
  bounded pipe and must carry a per-run nonce; the directory is removed afterwards.
A program that loops, allocates 10 GB, forks without end, opens sockets or writes outside its
directory gets reward 0 with the reason; the worker is unharmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


async def run_tests(source: str, func: str, tests: list[list[Any]], limits: Limits = Limits()) -> SandboxResult:
    """Run `func` of `source` on each (args, expected) of `tests` in the sandbox."""
    start = time.monotonic()
    home = tempfile.mkdtemp(prefix="astraflow-sandbox-")
    try:
        if os.getuid() == 0:
            os.chown(home, NOBODY, NOBODY)
        os.chmod(home, 0o700)
        nonce = secrets.token_hex(16)
        job = json.dumps({"source": source, "func": func, "tests": tests, "nonce": nonce,
                          "limits": {"cpu_s": limits.cpu_s, "memory_mb": limits.memory_mb,
                                     "fsize_mb": limits.fsize_mb, "nofile": limits.nofile,
                                     "nproc": limits.nproc}}).encode()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", str(HARNESS), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, cwd=home,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, start_new_session=True)
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
        total = len(tests)
        if timed_out:
            return SandboxResult(0, total, f"wall-clock limit of {limits.wall_s}s", wall)
        for line in out.decode("utf-8", "replace").splitlines():
            if line.startswith(nonce):
                try:
                    verdict = json.loads(line[len(nonce):])
                except ValueError:
                    break
                return SandboxResult(int(verdict.get("passed", 0)), total, verdict.get("reason"), wall,
                                     verdict.get("network"))
        rc = proc.returncode
        if rc is not None and rc < 0:
            name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
            why = "CPU time limit" if -rc == signal.SIGXCPU else f"killed by {name}"
        else:
            why = f"exited with status {rc} without a verdict"
        return SandboxResult(0, total, why, wall)
    finally:
        shutil.rmtree(home, ignore_errors=True)
