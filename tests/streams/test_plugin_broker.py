"""A plug-in package (examples/astraflow-plugin-example), pip-installed into a temporary --target
directory (never into the shared venv), is usable by name in a recipe and runs inside a real
Faust worker against the real broker."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streams.testing import make_traj
from tests.conftest import REPO, subprocess_env
from tests.streams.conftest import MakeHarness

pytestmark = [pytest.mark.broker, pytest.mark.slow]

PIPELINE: list[dict[str, Any]] = [
    {"name": "length_penalty", "args": {"per_token": 0.1}},
    {"name": "dr_grpo"},
]


def install_plugin(tmp_path: Path) -> Path:
    src = tmp_path / "plugin-src"
    shutil.copytree(REPO / "examples" / "astraflow-plugin-example", src)  # build outside the repo
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(src),
        ],
        check=True,
        timeout=300,
    )
    assert list(target.glob("astraflow_plugin_example-*.dist-info/entry_points.txt"))
    return target


def test_plugin_runs_in_a_faust_worker(streams_harness: MakeHarness, tmp_path: Path) -> None:
    h = streams_harness(["policy"], PIPELINE)
    # without the package the name is unknown, and the error lists what is known
    check = subprocess.run(
        [sys.executable, "-m", "astraflow.cli", "streams", "-r", str(h.recipe), "--check"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert check.returncode == 1
    assert "unknown algorithm 'length_penalty'" in check.stderr and "grpo" in check.stderr

    target = install_plugin(tmp_path)
    env = {"PYTHONPATH": os.pathsep.join([str(target), str(REPO)])}
    check = subprocess.run(
        [sys.executable, "-m", "astraflow.cli", "streams", "-r", str(h.recipe), "--check"],
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert check.returncode == 0, check.stderr
    assert "validate -> group -> length_penalty -> dr_grpo -> route" in check.stdout

    worker = h.start(extra_env=env)
    short = make_traj("t0", 0, group_size=2, rewards=1.0, gen=5)  # 1 - 0.1 x 5  = 0.5
    long = make_traj("t0", 1, group_size=2, rewards=0.0, gen=10)  # 0 - 0.1 x 10 = -1.0
    h.send([(t.group_id.encode(), t) for t in (short, long)])
    samples = {s.traj_id: s for s in h.records("samples.policy", expect=2)}
    assert sorted(samples) == ["t0#0#0", "t0#0#1"]
    assert samples["t0#0#0"].reward == pytest.approx(0.5) and samples["t0#0#1"].reward == pytest.approx(-1.0)
    for tid, adv in (("t0#0#0", 0.75), ("t0#0#1", -0.75)):  # Dr. GRPO: r - mean(0.5, -1.0)
        s = samples[tid]
        np.testing.assert_allclose(s.advantages[s.loss_mask.astype(bool)], adv, rtol=1e-6)
    assert samples["t0#0#0"].group_mean == pytest.approx(-0.25)
    assert h.stop(worker) == 0
