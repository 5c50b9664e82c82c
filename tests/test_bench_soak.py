"""The soak bench's arithmetic (bench/soak.py): what counts as growth (which process is which:
tests/test_bench_proc_cpu.py)."""

from __future__ import annotations

import pytest

from bench import soak


def test_a_flat_line_has_no_slope_and_a_leak_shows_per_ten_minutes() -> None:
    assert soak.slope_per_10min([(t, 100.0) for t in range(0, 1800, 30)]) == pytest.approx(0.0)
    leak = [(float(t), 100.0 + t / 60) for t in range(0, 1800, 30)]  # 1 MiB a minute
    assert soak.slope_per_10min(leak) == pytest.approx(10.0)
    assert soak.slope_per_10min([(0.0, 1.0)]) == 0.0


def test_the_table_measures_growth_from_the_first_warm_sample() -> None:
    samples = [
        {"t": float(t), "rss": {"streams": 100.0 + (50.0 if t < 300 else 0.0) + t / 600}}
        for t in range(0, 1200, 60)
    ]
    [_, row] = soak.table(samples, warmup_s=300)
    name, warm, end, growth, slope = row.split()
    assert name == "streams" and float(warm) == pytest.approx(100.5) and float(end) == pytest.approx(101.9)
    assert float(growth) == pytest.approx(1.4) and slope == "+1.0/10m"


def test_the_soak_recipe_brings_the_dedupe_bounds_inside_the_run(tmp_path) -> None:
    import yaml

    from astraflow.config import load_recipe
    from tests.conftest import REPO

    data = yaml.safe_load((REPO / "recipes" / "arithmetic.yaml").read_text())
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(soak.soak_recipe(data, 600.0, 20_000)))
    recipe = load_recipe(tmp_path / "r.yaml")
    assert recipe.run.max_steps is None and recipe.trainer.dedupe_window == 20_000
    assert recipe.streams.group.dedupe_ttl_s == 600.0
    plain = soak.soak_recipe(data, None, None)
    assert plain["trainer"] == data["trainer"] and plain["streams"] == data["streams"]
