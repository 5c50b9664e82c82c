"""The local broker, driven through the CLI as a user would: start, kcat, topics, stop, errors."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from astraflow import topics
from astraflow.broker.jvm import QUICK_JIT
from tests.conftest import subprocess_env

ASTRAFLOW = [sys.executable, "-m", "astraflow.cli"]
pytestmark = [pytest.mark.broker, pytest.mark.slow]


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ASTRAFLOW, *args], capture_output=True, text=True, timeout=timeout, env=env or subprocess_env()
    )


def our_jvms(data_dir: Path) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "kafka.Kafka" in cmd and str(data_dir) in cmd:
                pids.append(int(proc.name))
    return pids


def kcat_topics(bootstrap: str) -> dict[str, int]:
    out = subprocess.run(
        ["kcat", "-b", bootstrap, "-L"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert re.search(r"1 brokers:\s+broker 1 at 127\.0\.0\.1:\d+", out), out
    return {m.group(1): int(m.group(2)) for m in re.finditer(r'topic "([^"]+)" with (\d+) partitions', out)}


def test_start_kcat_apply_stop(tmp_path: Path) -> None:
    assert shutil.which("kcat"), "kcat (Debian package) is needed: `make install` installs it"
    data = tmp_path / "broker"
    started = cli("broker", "start", "--port", "0", "--data-dir", str(data))
    assert started.returncode == 0, started.stderr
    bootstrap = started.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"127\.0\.0\.1:\d+", bootstrap)
    assert "kafka.log" in started.stderr  # the command says where the log is
    try:
        assert len(our_jvms(data)) == 1
        # a long-lived broker keeps the C2 compiler; a run's own gets C1 only (test_run_lifecycle)
        cmdline = Path(f"/proc/{our_jvms(data)[0]}/cmdline").read_bytes().split(b"\0")
        assert b"-Xmx512m" in cmdline and QUICK_JIT.encode() not in cmdline
        status = cli("broker", "status", "--data-dir", str(data))
        assert status.returncode == 0 and "answering" in status.stdout

        again = cli("broker", "start", "--port", "0", "--data-dir", str(data))  # already running: same broker
        assert again.returncode == 0 and again.stdout.strip().splitlines()[-1] == bootstrap
        assert len(our_jvms(data)) == 1

        applied = cli("topics", "apply", "--bootstrap", bootstrap, "--policies", "solver,verifier")
        assert applied.returncode == 0, applied.stderr
        listed = kcat_topics(bootstrap)
        expected = {s.name: s.partitions for s in topics.expand(topics.load_spec(), ["solver", "verifier"])}
        assert {k: v for k, v in listed.items() if not k.startswith("__")} == expected
        second = cli("topics", "apply", "--bootstrap", bootstrap, "--policies", "solver,verifier")
        assert second.returncode == 0 and "created" not in second.stdout
    finally:
        stopped = cli("broker", "stop", "--data-dir", str(data))
    assert stopped.returncode == 0 and "stopped" in stopped.stderr
    assert our_jvms(data) == []
    assert cli("broker", "status", "--data-dir", str(data)).returncode == 1

    # Started again on the same directory, the broker keeps its topics (data survives a restart).
    restarted = cli("broker", "start", "--port", "0", "--data-dir", str(data))
    assert restarted.returncode == 0, restarted.stderr
    try:
        assert "samples.verifier" in kcat_topics(restarted.stdout.strip().splitlines()[-1])
    finally:
        cli("broker", "stop", "--data-dir", str(data))
    assert our_jvms(data) == []


def test_port_taken_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = cli("broker", "start", "--port", str(port), "--data-dir", str(tmp_path / "b"))
    assert result.returncode == 1
    assert f"port {port}" in result.stderr and "taken" in result.stderr
    assert our_jvms(tmp_path / "b") == []


def test_jvm_that_dies_is_reported_with_its_log(tmp_path: Path) -> None:
    result = cli("broker", "start", "--port", "0", "--data-dir", str(tmp_path / "b"), "--heap", "1k")
    assert result.returncode == 1
    assert "exited with status" in result.stderr
    assert "heap" in result.stderr.lower()  # the JVM's own complaint, from the log tail
    assert str(tmp_path / "b" / "logs" / "kafka.log") in result.stderr


def _bin_with(tmp_path: Path, *tools: str) -> str:
    """A PATH holding only the named tools (and nothing else from the system)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in tools:
        found = shutil.which(tool)
        assert found, tool
        os.symlink(found, bindir / tool)
    return str(bindir)


def test_missing_java_is_a_clear_error(tmp_path: Path) -> None:
    env = subprocess_env(PATH=_bin_with(tmp_path, "mvn"))
    env.pop("JAVA_HOME", None)
    result = cli("broker", "start", "--port", "0", "--data-dir", str(tmp_path / "b"), env=env)
    assert result.returncode == 1
    assert "Java 17+ was not found" in result.stderr


def test_missing_maven_is_a_clear_error_when_jars_are_not_cached(tmp_path: Path) -> None:
    env = subprocess_env(PATH=_bin_with(tmp_path, "java"), ASTRAFLOW_HOME=str(tmp_path / "empty-cache"))
    result = cli("broker", "start", "--port", "0", "--data-dir", str(tmp_path / "b"), env=env)
    assert result.returncode == 1
    assert "Maven (mvn) was not found" in result.stderr
