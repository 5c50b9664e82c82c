"""The Kafka JVM of a broker or cluster node as a process: its flags, formatting its storage,
spawning it, telling it from another process of the same PID, and terminating it. Used by the
single broker (launcher.py), each node of a cluster (cluster.py) and the supervisor (its children
die with it too).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from astraflow.broker import classdata, secure
from astraflow.broker.jars import LOG4J
from astraflow.errors import BrokerError

if TYPE_CHECKING:
    from astraflow.broker.launcher import BrokerState


def is_our_jvm(pid: int, data_dir: Path) -> bool:
    """True if `pid` is alive and is the Kafka JVM of this data directory (guards against PID reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":  # a zombie is dead
            return False
    except (OSError, IndexError):
        return False
    return "kafka.Kafka" in cmdline and str(data_dir) in cmdline


#: C1 only: the compiler of a broker that lives for one run (`astraflow run`'s own).
QUICK_JIT = "-XX:TieredStopAtLevel=1"


def jvm_flags(heap: str, quick_jit: bool = False) -> list[str]:
    """The broker JVM's flags. `quick_jit` (a run's own broker) stops at the C1 compiler: C2
    compiling Kafka's hot paths cost the broker of a 1,000-step run of the vs-TRL task 28-35 s of
    CPU against 23-26 s with C1 (2 alternating pairs on 2 cores, 2026-12-06), and C1's code was no
    dearer per step after 150 steps (20-21 ms against 23-26 ms a step), so on 2 cores the run got
    ~5-9 s of CPU back. A long-lived broker (`astraflow broker start`, the test suite's) keeps C2,
    whose code may pay off over hours (bench/RESULTS.md)."""
    return [
        f"-Xms{heap}",
        f"-Xmx{heap}",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        *([QUICK_JIT] if quick_jit else []),
    ]


def spawn_kafka(
    java: str,
    heap: str,
    libs: Path,
    data_dir: Path,
    props: Path,
    logs: Path,
    die_with_parent: bool,
    extra_flags: list[str] | tuple[str, ...] = (),
    quick_jit: bool = False,
) -> subprocess.Popen[bytes]:
    """Start one Kafka JVM on `props` in its own session, its output appended to logs/kafka.out
    (the single broker's start and each node of a cluster); `quick_jit`: see `jvm_flags`."""
    cmd = [
        java,
        *jvm_flags(heap, quick_jit),
        *extra_flags,
        f"-Dlog4j2.configurationFile=file:{LOG4J}",
        f"-Dkafka.logs.dir={logs}",
        f"-Dastraflow.data.dir={data_dir}",
        "-cp",
        f"{libs}/*",
        "kafka.Kafka",
        str(props),
    ]
    with open(logs / "kafka.out", "ab") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=data_dir,
            preexec_fn=die_with_parent_signal if die_with_parent else None,
        )


def die_with_parent_signal() -> None:  # pragma: no cover - runs in the child between fork and exec
    """PR_SET_PDEATHSIG: SIGTERM this process when its parent dies, even by SIGKILL."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def new_cluster_id() -> str:
    cluster_id = "-"
    while cluster_id.startswith(
        "-"
    ):  # as Kafka's Uuid.randomUuid: the tool's parser takes "-x" for an option
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    return cluster_id


def format_storage(
    java: str,
    libs: Path,
    data_dir: Path,
    props: Path,
    state: BrokerState | None,
    cluster_id: str | None = None,
    passwords: dict[str, str] | None = None,
) -> str:
    """Format `data_dir/data` once (with `cluster_id`, or a new one; with `passwords`, the SCRAM
    users of secure mode); returns the id it holds."""
    meta = data_dir / "data" / "meta.properties"
    if meta.exists():
        match = re.search(r"cluster\.id=(\S+)", meta.read_text())
        if match:
            return match.group(1)
    cluster_id = cluster_id or new_cluster_id()
    cmd = [
        java,
        "-Xmx256m",
        *classdata.tool_flags(java, libs),
        f"-Dlog4j2.configurationFile=file:{LOG4J}",
        f"-Dkafka.logs.dir={data_dir / 'logs'}",
        "-cp",
        f"{libs}/*",
        "kafka.tools.StorageTool",
        "format",
        "-t",
        cluster_id,
        "-c",
        str(props),
        "--ignore-formatted",
        *(secure.scram_format_args(passwords) if passwords else []),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise BrokerError(
            f"formatting Kafka storage in {data_dir / 'data'} failed:\n"
            f"{(result.stdout + result.stderr).strip()[-2000:]}"
        )
    return cluster_id


def terminate(pid: int, data_dir: Path, timeout: float) -> bool:
    """SIGTERM, wait, then SIGKILL. Returns True if the process was ours and is now gone."""
    if not is_our_jvm(pid, data_dir):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.time() + timeout
    while time.time() < deadline:
        reap(pid)
        if not is_our_jvm(pid, data_dir):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    for _ in range(50):
        reap(pid)
        if not is_our_jvm(pid, data_dir):
            break
        time.sleep(0.1)
    return True


def reap(pid: int) -> None:
    """Collect the exit status if the JVM is our child (started in this process)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
