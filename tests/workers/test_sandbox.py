"""The code sandbox survives hostile programs: reward 0 with the reason, the caller unharmed."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
from pathlib import Path

import pytest

from workers.envs import sandbox_isolation
from workers.envs.sandbox import Limits, run_tests
from workers.envs.sandbox_judge import Verdict, judge, plain, same

TESTS = [[[1], 2], [[5], 6]]
# 1 s of CPU took up to 2.8 s of wall time on a loaded 2-core host (nice 15): the wall-clock limit
# must leave room, or a loop is reported as too slow instead of as over its CPU time.
LIMITS = Limits(cpu_s=1.0, memory_mb=256, wall_s=5.0)

HOSTILE = {
    "loops forever": ("def f(x):\n    while True:\n        pass\n", "CPU time limit"),
    "sleeps forever": ("import time\ndef f(x):\n    time.sleep(1000)\n", "wall-clock limit"),
    "allocates 10 GB": ("def f(x):\n    b = bytearray(10 * 1024**3)\n    return x + 1\n", "MemoryError"),
    "forks without end": ("import os\ndef f(x):\n    while True:\n        os.fork()\n", "os.fork"),
    "forks and swallows errors": (
        "import os\ndef f(x):\n    for _ in range(10000):\n        try:\n"
        "            os.fork()\n        except BaseException:\n            pass\n"
        "    return x + 1\n",
        "os.fork",
    ),
    "spawns a subprocess": (
        "import subprocess\ndef f(x):\n    subprocess.run(['true'])\n    return x + 1\n",
        "subprocess.Popen",
    ),
    "opens a socket": (
        "import socket\ndef f(x):\n    socket.create_connection(('127.0.0.1', 9))\n    return x + 1\n",
        "socket",
    ),
}


def run(source: str, tests: list = TESTS) -> object:
    return asyncio.run(run_tests(source, "f", tests, LIMITS))


def test_correct_and_wrong_programs() -> None:
    ok = run("def f(x):\n    return x + 1\n")
    assert (ok.passed, ok.total, ok.reason) == (2, 2, None)
    wrong = run("def f(x):\n    return x\n")
    assert wrong.passed == 0 and "expected 2" in wrong.reason
    broken = run("def f(x) return\n")
    assert broken.passed == 0 and "SyntaxError" in broken.reason


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program_scores_zero_with_reason(name: str) -> None:
    source, why = HOSTILE[name]
    result = run(source)
    assert result.passed == 0 and result.score == 0.0
    assert why in (result.reason or ""), result.reason
    assert result.wall_s < LIMITS.wall_s + 2.0


def test_writing_outside_its_directory_is_blocked(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    result = run(f"def f(x):\n    open({str(target)!r}, 'w').write('x')\n    return x + 1\n")
    assert result.passed == 0 and "write outside" in result.reason
    assert not target.exists()
    removal = run("import os\ndef f(x):\n    os.remove('/etc/hostname')\n    return x + 1\n")
    assert removal.passed == 0 and "os.remove" in removal.reason
    inside = run("def f(x):\n    open('scratch.txt', 'w').write('x')\n    return x + 1\n")
    assert inside.passed == 2  # its own directory is writable


def test_no_process_survives_a_fork_bomb() -> None:
    run(HOSTILE["forks without end"][0])
    if os.getuid() == 0:  # the sandbox ran as nobody: nothing of that uid may be left
        left = subprocess.run(
            ["pgrep", "-u", "65534", "-f", "sandbox_harness"], capture_output=True, text=True
        )
        assert left.stdout.strip() == ""


def test_network_is_unreachable_in_the_namespace() -> None:
    result = run("def f(x):\n    return x + 1\n")
    # a new network namespace when the kernel allows it; otherwise the audit hook alone blocks sockets
    assert result.network in ("netns", "userns+netns", "audit-only")


# -- the judge: pure functions on the child's bytes ------------------------------------------------


def lines(*records: object) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def test_same_checks_exact_types() -> None:
    assert same([1, {"a": "b"}, None, 2.5], [1, {"a": "b"}, None, 2.5])
    assert not same(True, 1) and not same(1, True) and not same(1.0, 1) and not same("1", 1)
    assert not same([1, 2], [1, 2, 3]) and not same({"a": 1}, {"a": 1, "b": 2}) and not same([[1]], [[True]])
    assert plain((1, [2, (3,)])) == [1, [2, [3]]]  # expected values are compared after the JSON round trip


def test_judge_counts_exact_results() -> None:
    v = judge(lines({"n": "netns"}, {"r": 2}, {"r": 7}), [2, 6], 1000)
    assert v == Verdict(1, True, "test 1: got 7, expected 6", "netns")
    assert judge(lines({"r": 2}, {"r": 6}), [2, 6], 1000) == Verdict(2, True, None)
    assert judge(lines({"r": True}, {"r": 6.0}), [1, 6], 1000).passed == 0
    unjudgeable = judge(lines({"x": "Int"}, {"r": 6}), [2, 6], 1000)
    assert unjudgeable == Verdict(
        1, True, "test 0: got a value of type Int, not a plain JSON value, expected 2"
    )
    stopped = judge(lines({"r": 2}, {"e": "ValueError: no"}), [2, 6], 1000)
    assert stopped == Verdict(1, True, "ValueError: no")
    assert judge(lines({"r": 2}), [2, 6], 1000) == Verdict(1, False, None)  # died before the end


@pytest.mark.parametrize(
    ("out", "why"),
    [
        (lines({"r": 2}, {"r": 6}, {"r": 6}), "more than 2 results"),
        (lines({"passed": 2}), "unknown record 'passed'"),
        (lines({"r": 2, "x": "int"}), "not a one-key object"),
        (lines({"e": "stop"}, {"r": 2}), "after the final error"),
        (lines({"r": 2}) + b'{"r": 6}', "unterminated"),
        (b"not json\n", "JSONDecodeError"),
        (b"[" * 100_000 + b"\n", "RecursionError"),
        (b'{"r": ' + b"9" * 5000 + b"}\n", "ValueError"),
        (lines(*[{"r": 2}] * 2000), "more than 2 results"),
        (lines({"r": 2}) + b" " * 1_000_000 + b"\n", "more than 1000000 bytes"),
    ],
)
def test_judge_scores_malformed_output_zero(out: bytes, why: str) -> None:
    v = judge(out, [2, 6], 1_000_000)
    assert v.passed == 0 and not v.complete and why in (v.reason or ""), v


# -- isolation: the fallback is loud -------------------------------------------------------------


def test_without_bwrap_it_falls_back_loudly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sandbox_isolation, "_probed", {})
    monkeypatch.setattr(sandbox_isolation.shutil, "which", lambda name: None)
    caplog.set_level(logging.WARNING, logger=sandbox_isolation.__name__)
    fallback = asyncio.run(run_tests("def f(x):\n    return x + 1\n", "f", TESTS, LIMITS))
    assert (fallback.passed, fallback.isolation) == (2, "none")
    required = asyncio.run(run_tests("def f(x):\n    return x + 1\n", "f", TESTS, LIMITS, "bwrap"))
    assert (
        required.passed == 0
        and "isolation required but unavailable: bwrap is not installed" in required.reason
    )
    warnings = [r for r in caplog.records if "SANDBOX NOT ISOLATED" in r.getMessage()]
    assert len(warnings) == 1  # once per process, not per program


def test_bwrap_isolates_here() -> None:
    """`make test` installs bubblewrap; on this machine the sandbox must be isolated, not fall back."""
    result = run("def f(x):\n    return x + 1\n")
    assert (result.passed, result.isolation, result.network) == (2, "bwrap", "netns"), result


def test_bwrap_without_namespaces_falls_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As in a Docker container with the default seccomp profile: bwrap is there but cannot unshare."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(sandbox_isolation, "_probed", {})
    caplog.set_level(logging.WARNING, logger=sandbox_isolation.__name__)
    result = run("def f(x):\n    return x + 1\n")
    assert (result.passed, result.isolation) == (2, "none")
    assert "No permissions to create new namespace" in caplog.text and "SANDBOX NOT ISOLATED" in caplog.text
