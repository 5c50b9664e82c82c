"""Fault tolerance of `astraflow trainer` as a process: SIGKILL between checkpoints, restart, and
every group trained exactly once; SIGTERM exits 0 after a checkpoint; published versions are never
contradicted. Also the lockstep barrier between two policies' trainers, with HTTP weight serving."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from astraflow.config import KafkaSettings, Recipe
from astraflow.records import WeightVersion
from astraflow.weights import fetch_weights
from tests.conftest import MakeTopics, subprocess_env
from tests.kafka_helpers import read_now, wait_for
from tests.trainer.synth import make_group, produce, recipe

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def write_recipe(path: Path, r: Recipe) -> Path:
    path.write_text(yaml.safe_dump(r.model_dump(mode="json")))
    return path


def start(recipe_file: Path, run_dir: Path, policy: str = "p") -> subprocess.Popen[str]:
    log = open(run_dir.parent / f"{run_dir.name}-{policy}-{time.time_ns()}.log", "w")  # noqa: SIM115
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "astraflow.cli",
            "trainer",
            "--recipe",
            str(recipe_file),
            "--policy",
            policy,
            "--run-dir",
            str(run_dir),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        env=subprocess_env(),
    )


def ledger(run_dir: Path, policy: str = "p") -> list[dict]:
    path = run_dir / "trainer" / policy / "trained.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


def reap(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def checkpoints(run_dir: Path, policy: str = "p") -> list[int]:
    root = run_dir / "trainer" / policy / "checkpoints"
    return sorted(int(p.name.split("-")[1]) for p in root.glob("step-*")) if root.exists() else []


def test_sigkill_between_checkpoints_then_restart_trains_every_group_once(
    kafka: KafkaSettings,
    topics: MakeTopics,
    tmp_path: Path,
) -> None:
    topics(["p"])
    groups = {f"g{i:02d}": make_group("p", f"g{i:02d}", seed=i) for i in range(20)}
    run_dir = tmp_path / "run"
    rfile = write_recipe(
        tmp_path / "r.yaml", recipe(kafka, batch_groups=2, publish_every=2, keep_checkpoints=5)
    )
    # wave 1: ten complete groups (five steps; checkpoints at 2 and 4) and three half groups that
    # cannot train yet, interleaved so that their samples sit between trained ones in every partition
    half = ["g10", "g11", "g12"]
    wave1 = []
    for i in range(10):
        wave1 += groups[f"g{i:02d}"][:2]
        if i < 3:
            wave1 += groups[half[i]][:2]
        wave1 += groups[f"g{i:02d}"][2:]
    produce(kafka, wave1, "p")
    proc = start(rfile, run_dir)
    try:
        wait_for(lambda: len(ledger(run_dir)) >= 5, 120, "five trained batches", 0.1, proc)
        time.sleep(0.5)  # nothing more can train: the half groups are incomplete
        assert len(ledger(run_dir)) == 5 and checkpoints(run_dir)[-1] == 4  # step 5 is not checkpointed
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
        before = {e.version: e for e in read_now(kafka, "weights", WeightVersion)}
        assert max(before) == 2  # published at steps 2 and 4

        # wave 2, as a restarted streams stage would send it: the rest of the half groups, seven new
        # groups, and again every sample of g00 (checkpointed) and g08 (trained in the lost step 5)
        wave2 = [s for g in half for s in groups[g][2:]]
        wave2 += [s for i in range(13, 20) for s in groups[f"g{i:02d}"]] + groups["g00"] + groups["g08"]
        produce(kafka, wave2, "p")
        proc = start(rfile, run_dir)
        wait_for(
            lambda: sum(len(x["groups"]) for x in ledger(run_dir)) >= 20, 120, "all 20 groups", 0.1, proc
        )
        time.sleep(1.0)  # give a wrongly re-trained duplicate the chance to show up
        stop(proc)
    finally:
        reap(proc)

    lines = ledger(run_dir)
    trained = Counter(g for x in lines for g in x["groups"])
    assert set(trained) == {f"{g}#0" for g in groups} and set(trained.values()) == {1}, trained
    assert [x["step"] for x in lines] == list(range(1, 11)) and all(x["trained"] for x in lines)
    assert checkpoints(run_dir)[-1] == 10
    final = json.loads((run_dir / "trainer/p/checkpoints/step-00000010/trainer_state.json").read_text())
    # re-read after the seek to the checkpoint's offsets, or re-sent: dropped as duplicates
    assert final["buffer"]["counts"]["samples.duplicate"] >= 8
    after = read_now(kafka, "weights", WeightVersion)
    assert sorted({e.version for e in after}) == list(range(6))
    for e in after:  # a version announced twice (before and after the crash) is the same weights
        first = before.get(e.version) or next(x for x in after if x.version == e.version)
        assert (e.snapshot_sha256, e.delta_sha256) == (first.snapshot_sha256, first.delta_sha256)
    assert fetch_weights(after[-1], fetch_weights(before[2], None)).version == 5


def test_sigkill_after_publications_past_the_checkpoint_loses_those_versions_not_their_numbers(
    kafka: KafkaSettings, topics: MakeTopics, tmp_path: Path
) -> None:
    """Checkpoints every 4 steps, a version every step: killed after step 6, the trainer resumes at
    step 4. Versions 5 and 6 were announced (workers may hold them), so their numbers are never
    reused: the resumed weights become version 7, and samples rolled out with 5 or 6 are stale."""
    topics(["p"])
    run_dir = tmp_path / "run"
    rfile = write_recipe(tmp_path / "r.yaml", recipe(kafka, batch_groups=1, checkpoint_every=4))
    produce(
        kafka, [s for i in range(6) for s in make_group("p", f"a{i}", version=i, seed=i)], "p", partition=0
    )
    proc = start(rfile, run_dir)
    try:
        wait_for(
            lambda: any(e.version == 6 for e in read_now(kafka, "weights", WeightVersion)),
            120,
            "version 6",
            0.1,
            proc,
        )
        assert checkpoints(run_dir) == [4]
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
        before = read_now(kafka, "weights", WeightVersion)
        assert sorted(e.version for e in before) == list(range(7))

        stale = [s for v in (5, 6) for s in make_group("p", f"b{v}", version=v, seed=v)]
        fresh = [s for i in range(3) for s in make_group("p", f"n{i}", version=7, seed=10 + i)]
        produce(kafka, stale + fresh, "p", partition=0)
        proc = start(rfile, run_dir)
        wait_for(lambda: any("n2#0" in x["groups"] for x in ledger(run_dir)), 120, "n2 trained", 0.1, proc)
        stop(proc)
    finally:
        reap(proc)

    after = read_now(kafka, "weights", WeightVersion)
    shas = {}
    for e in before + after:  # one version number, one set of weights
        assert shas.setdefault(
            e.version, e.snapshot_sha256 if e.delta_sha256 is None else e.delta_sha256
        ) == (e.snapshot_sha256 if e.delta_sha256 is None else e.delta_sha256), e.version
    assert [e.version for e in after if e.version > 6][0] == 7
    v4, v7 = (fetch_weights(next(e for e in after if e.version == v), None) for v in (4, 7))
    assert all(v4.state[k].equal(v7.state[k]) for k in v4.state)  # 7 is the checkpoint's weights
    lines = ledger(run_dir)
    trained = {g for x in lines if x["trained"] for g in x["groups"]}
    dropped = {g for x in lines if not x["trained"] for g in x["groups"]}
    assert {f"a{i}#0" for i in range(5)} | {"n0#0", "n1#0", "n2#0"} <= trained
    assert {"a5#0", "b5#0", "b6#0"} <= dropped and not dropped & trained, (trained, dropped)
    final = json.loads(
        (
            run_dir / "trainer/p/checkpoints" / f"step-{checkpoints(run_dir)[-1]:08d}" / "trainer_state.json"
        ).read_text()
    )
    assert final["buffer"]["lost"] == [[4, 6]]


def test_lockstep_policies_never_run_more_than_one_version_apart(
    kafka: KafkaSettings,
    topics: MakeTopics,
    tmp_path: Path,
) -> None:
    topics(["a", "b"])
    for policy in ("a", "b"):
        produce(kafka, [s for i in range(8) for s in make_group(policy, f"{policy}{i}", seed=i)], policy)
    r = recipe(kafka, policies=("a", "b"), batch_groups=2, lockstep=True, serve_http=True)
    rfile = write_recipe(tmp_path / "r.yaml", r)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    a = start(rfile, run_dir, "a")
    b = None
    try:
        wait_for(
            lambda: any(e.policy == "a" for e in read_now(kafka, "weights", WeightVersion)),
            120,
            "a's version 0",
            0.1,
            a,
        )
        time.sleep(2.0)
        assert ledger(run_dir, "a") == []  # b has not published version 0: a may not train
        b = start(rfile, run_dir, "b")
        for name, proc in (("a", a), ("b", b)):
            wait_for(lambda n=name: len(ledger(run_dir, n)) >= 4, 120, f"{name}'s four steps", 0.1, proc)
        # a step's ledger line is written before its version is published: wait for both version 4s
        for name, proc in (("a", a), ("b", b)):
            wait_for(
                lambda n=name: any(
                    e.policy == n and e.version == 4 for e in read_now(kafka, "weights", WeightVersion)
                ),
                120,
                f"{name}'s version 4",
                0.1,
                proc,
            )
        events = read_now(kafka, "weights", WeightVersion)
        latest = {e.policy: e for e in events}
        assert latest["b"].snapshot_uri.startswith("http://127.0.0.1:")  # served by b's trainer
        assert fetch_weights(latest["b"], None).version == 4
        for proc in (a, b):
            proc.send_signal(signal.SIGTERM)
        assert a.wait(60) == 0 and b.wait(60) == 0
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    seen = {"a": -1, "b": -1}
    for e in events:
        seen[e.policy] = max(seen[e.policy], e.version)
        if min(seen.values()) >= 0:
            assert abs(seen["a"] - seen["b"]) <= 1, seen
    assert seen == {"a": 4, "b": 4}
