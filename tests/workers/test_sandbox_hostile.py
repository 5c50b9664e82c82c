"""The hostile corpus (`sandbox_hostile.py`, `sandbox_escapes.py`) against the code sandbox: 0 forged
rewards, 0 escapes.

Each program must score 0 with a reason, the worker-side `run_tests` must then still give an honest
program full marks, and nothing may show outside: the outside directory holds exactly what the
test put there, the victim file keeps its content and mode, nobody connected to the listening
sockets, and the secret in the worker's environment appears in no reason. With `isolation="bwrap"`
the run fails (no fallback) where bubblewrap cannot isolate: `make test` installs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.workers.sandbox_escapes import ESCAPES
from tests.workers.sandbox_hostile import FORGERIES, Hostile
from workers.envs.sandbox import Isolation, Limits, SandboxResult, run_tests

TESTS = [[[1], 2], [[5], 6]]
LIMITS = Limits(cpu_s=1.0, memory_mb=256, wall_s=3.0)
HONEST = "def f(x):\n    return x + 1\n"
SECRET_VAR = "ASTRAFLOW_TEST_SANDBOX_SECRET"
CORPUS = FORGERIES + ESCAPES


@dataclass
class Outside:
    dir: Path
    tcp: socket.socket
    unix: socket.socket
    secret: str
    victim_text: str

    def fill(self, source: str) -> str:
        return (
            source.replace("OUTSIDE", str(self.dir))
            .replace("UNIX_SOCK", str(self.dir / "sock"))
            .replace("PORT", str(self.tcp.getsockname()[1]))
            .replace("SECRET_VAR", SECRET_VAR)
        )

    def assert_untouched(self) -> None:
        assert sorted(os.listdir(self.dir)) == ["sock", "victim.txt"]
        victim = self.dir / "victim.txt"
        assert victim.read_text() == self.victim_text
        assert stat.S_IMODE(victim.stat().st_mode) == 0o666
        for listener in (self.tcp, self.unix):
            with pytest.raises(BlockingIOError):
                listener.accept()


@pytest.fixture
def outside(monkeypatch: pytest.MonkeyPatch) -> Iterator[Outside]:
    # Under /tmp and world-writable, so that only the sandbox (not the test's own 0700 tmp_path, nor
    # the uid nobody) stands between a program and these files.
    path = Path(tempfile.mkdtemp(prefix="astraflow-outside-", dir="/tmp"))
    path.chmod(0o777)
    secret = secrets.token_hex(12)
    monkeypatch.setenv(SECRET_VAR, secret)
    victim_text = f"{SECRET_VAR}={secret}\n"
    (path / "victim.txt").write_text(victim_text)
    (path / "victim.txt").chmod(0o666)
    tcp = socket.create_server(("127.0.0.1", 0))
    tcp.setblocking(False)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(path / "sock"))
    (path / "sock").chmod(0o777)
    unix.listen()
    unix.setblocking(False)
    try:
        yield Outside(path, tcp, unix, secret, victim_text)
    finally:
        tcp.close()
        unix.close()
        shutil.rmtree(path, ignore_errors=True)


def run(source: str, isolation: Isolation) -> SandboxResult:
    return asyncio.run(run_tests(source, "f", TESTS, LIMITS, isolation))


def check(case: Hostile, outside: Outside, isolation: Isolation) -> None:
    result = run(outside.fill(case.source), isolation)
    assert result.isolation == ("bwrap" if isolation == "bwrap" else "none"), result
    assert (result.passed, result.score) == (0, 0.0), result
    assert result.reason, result
    assert outside.secret not in result.reason
    assert "isolation required" not in result.reason
    outside.assert_untouched()
    honest = run(HONEST, isolation)
    assert (honest.passed, honest.total, honest.reason) == (2, 2, None), honest


@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_hostile_program_gains_nothing_in_bubblewrap(case: Hostile, outside: Outside) -> None:
    check(case, outside, "bwrap")


FALLBACK = [c for c in CORPUS if not c.kernel_only]


@pytest.mark.parametrize("case", FALLBACK, ids=[c.name for c in FALLBACK])
def test_hostile_program_gains_nothing_unisolated(case: Hostile, outside: Outside) -> None:
    check(case, outside, "none")


def test_the_corpus_is_big_and_its_leak_channel_works(outside: Outside) -> None:
    assert len(CORPUS) >= 25 and len({c.name for c in CORPUS}) == len(CORPUS)
    # The secret-hunting programs report what they find in the reason: show that this channel works,
    # so that a secret missing from the reason means it was not found, not that it was lost.
    leaked = run(
        outside.fill(
            CORPUS[-1]
            .source.replace("OUTSIDE/victim.txt", "mine.txt")
            .replace("def f(x):", f"open('mine.txt', 'w').write('{SECRET_VAR}=abc')\ndef f(x):", 1)
        ),
        "bwrap",
    )
    assert leaked.passed == 0 and f"LEAK:{SECRET_VAR}=abc" in (leaked.reason or ""), leaked


WALLS = r"""
import json, os, socket, sys, _posixsubprocess
seen = {"pid": os.getpid(), "root": sorted(os.listdir('/')), "env": dict(os.environ), "cwd": os.getcwd()}
def attempt(name, fn):
    try:
        fn()
        seen[name] = "done"
    except OSError as exc:
        seen[name] = type(exc).__name__
attempt("write_outside", lambda: open(sys.argv[1] + '/walls.txt', 'w').write('pwned'))
attempt("write_root", lambda: open('/pwned', 'w').write('pwned'))
attempt("write_home", lambda: open('mine.txt', 'w').write('fine'))
attempt("write_dev_shm", lambda: open('/dev/shm/unbounded', 'w').write('pwned'))  # a tmpfs without a size
attempt("write_dev_null", lambda: open('/dev/null', 'w').write('fine'))
attempt("fill_home", lambda: open('big', 'wb').write(b'x' * (64 << 20)))
attempt("tcp", lambda: socket.create_connection(('127.0.0.1', int(sys.argv[2])), timeout=1))
attempt("unix", lambda: socket.socket(socket.AF_UNIX).connect(sys.argv[1] + '/sock'))
attempt("proc", lambda: open('/proc/1/environ', 'rb').read())
def shell():  # fork_exec returns a pid even when the exec fails: look for the effect
    pid = _posixsubprocess.fork_exec(
        [b'/bin/sh', b'-c', b'echo x > shell.txt'], [b'/bin/sh'], True, (), None, None, -1, -1, -1, -1,
        -1, -1, *os.pipe(), False, False, -1, None, None, None, -1, None, False)
    os.waitpid(pid, 0)
    open('shell.txt').close()
attempt("shell", shell)
import ctypes  # the seccomp filter (x86-64): no new namespaces, no ptrace, no sockets but AF_UNIX
libc = ctypes.CDLL(None, use_errno=True)
seen["unshare_userns"] = libc.unshare(0x10000000) == 0 or ctypes.get_errno()
seen["ptrace"] = libc.ptrace(16, 1, 0, 0) == 0 or ctypes.get_errno()  # PTRACE_ATTACH to pid 1
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM))
attempt("socketpair", lambda: socket.socketpair())
print(json.dumps(seen))
"""


def test_bubblewrap_walls_hold_without_the_audit_hook(outside: Outside) -> None:
    """The kernel's walls alone (no harness, no audit hook, not even the uid drop) stop the escapes.

    Here the program is root inside bwrap (with only CAP_SETUID/SETGID, or in a user namespace)."""
    from workers.envs.sandbox import HARNESS
    from workers.envs.sandbox_isolation import bwrap_argv, probe, seccomp_fd

    assert probe(HARNESS) is None, probe(HARNESS)
    fd = seccomp_fd()
    assert fd is not None or platform.machine() != "x86_64"
    try:
        done = subprocess.run(
            [*bwrap_argv(HARNESS, fd), "-c", WALLS, str(outside.dir), str(outside.tcp.getsockname()[1])],
            capture_output=True,
            text=True,
            timeout=30,
            pass_fds=() if fd is None else (fd,),
        )
    finally:
        if fd is not None:
            os.close(fd)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["pid"] <= 3  # its own pid namespace: bwrap's reaper is 1
    assert not {"proc", "tmp", "etc", "work"} & set(seen["root"]), seen["root"]
    assert seen["env"] == {"LANG": "C.UTF-8", "PWD": seen["cwd"]}
    assert seen["write_home"] == "done" and seen["socketpair"] == "done"
    if fd is not None:
        assert (seen["unshare_userns"], seen["ptrace"], seen["netlink"]) == (1, 1, "PermissionError"), seen
    assert seen["write_dev_null"] == "done"
    for escape in (
        "write_outside",
        "write_root",
        "write_dev_shm",
        "fill_home",
        "tcp",
        "unix",
        "proc",
        "shell",
    ):
        assert seen[escape] != "done", (escape, seen)
    outside.assert_untouched()


def test_killing_bwrap_ends_every_process_inside() -> None:
    """What the wall-clock kill relies on: a process the program forked (no audit hook here)
    dies with bwrap."""
    from workers.envs.sandbox import HARNESS
    from workers.envs.sandbox_isolation import bwrap_argv

    marker = f"astraflow-orphan-{secrets.token_hex(6)}"
    script = (
        f"# {marker}\nimport os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
        "print('forked', flush=True)\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [*bwrap_argv(HARNESS), "-c", script], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"forked\n"
        alive = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
        assert len(alive) >= 3  # bwrap, the program and its own-session child
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
    for _ in range(50):
        left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
        if not left:
            break
        time.sleep(0.1)
    assert left == []
