"""One recipe, one setting varied, the same seeds: `astraflow run` of every (value, seed) pair and
a table of what each value did. The engine of bench/loss_compare.py and bench/batch_order.py.

Reported per run (first policy of the recipe unless `--policy`), from its summary.json and
metrics.jsonl: mean reward of the first and last tenth of the steps and the best tenth
(astraflow/runner/report.py), samples dropped as stale and their share of the samples consumed,
the lag distribution of the trained samples (share at lag 0, 1, 2, ..., and the mean), the mean
of `mismatch.abs` over the steps, and the wall time. The per-value row is the mean over seeds.

    python -m bench.variants RECIPE --key trainer.order --values fifo,edf [--seeds 2] [--steps 80]
        [--out runs/variants] [--bootstrap HOST:PORT] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from bench.learning_seeds import RECIPES, REPO, run_recipe, seeded, set_key
from bench.machine import describe


def run_stats(run_dir: Path, summary: dict[str, Any], policy: str) -> dict[str, Any]:
    """What one run did (see the module docstring)."""
    from astraflow.runner.report import load_metrics, trainer_series

    series = trainer_series(load_metrics(run_dir / "metrics.jsonl")).get(policy, [])
    last = series[-1] if series else {}
    lags: Counter[str] = Counter()
    for s in series:
        for k, v in s.items():
            if k.startswith("staleness.lag."):
                lags[k.removeprefix("staleness.lag.")] += int(v)
    trained = sum(lags.values())
    mismatch = [s["mismatch.abs"] for s in series if math.isfinite(s.get("mismatch.abs", math.nan))]
    reward = summary.get("policies", {}).get(policy, {}).get("reward", {})
    stale, consumed = last.get("samples.stale", 0.0), last.get("samples.in", 0.0)
    numeric = sorted((k for k in lags if k.isdigit()), key=int)
    return {
        "steps": len(series),
        "first_tenth": reward.get("first_tenth"),
        "last_tenth": reward.get("last_tenth"),
        "best_tenth": reward.get("best_tenth"),
        "stale": stale,
        "stale_share": stale / consumed if consumed else 0.0,
        "lag_share": {k: lags[k] / trained for k in [*numeric, *sorted(set(lags) - set(numeric))]}
        if trained
        else {},
        "lag_mean": sum(int(k) * n for k, n in lags.items() if k.isdigit()) / trained if trained else 0.0,
        "mismatch_abs": sum(mismatch) / len(mismatch) if mismatch else None,
        "wall_minutes": summary.get("wall_minutes"),
    }


def mean(values: list[Any]) -> float | None:
    got = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return sum(got) / len(got) if got else None


def table(key: str, rows: list[dict[str, Any]]) -> str:
    """Markdown: one line per (value, seed), then the mean of each value over its seeds."""

    def f(v: Any, digits: int = 3) -> str:
        return "-" if v is None else f"{v:.{digits}f}"

    def lag(r: dict[str, Any]) -> str:
        return " / ".join(f"{v:.2f}" for v in r["lag_share"].values()) or "-"

    head = (
        f"| {key} | seed | steps | reward first tenth | last tenth | best tenth | stale dropped (share) "
        "| lag 0 / 1 / 2 ... share | mean lag | mismatch.abs | wall min |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['value']} | {r['seed']} | {r['steps']} | {f(r['first_tenth'])} | {f(r['last_tenth'])} | "
            f"{f(r['best_tenth'])} | {r['stale']:.0f} ({r['stale_share']:.1%}) | {lag(r)} | "
            f"{f(r['lag_mean'], 2)} | {f(r['mismatch_abs'], 4)} | {f(r['wall_minutes'], 1)} |"
        )
    values = list(dict.fromkeys(r["value"] for r in rows))
    lines += [
        "",
        (
            f"| {key} | seeds | reward first tenth | last tenth | best tenth | stale share | mean lag "
            "| mismatch.abs |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for v in values:
        mine = [r for r in rows if r["value"] == v]
        m = {
            k: mean([r[k] for r in mine])
            for k in ("first_tenth", "last_tenth", "best_tenth", "stale_share", "lag_mean", "mismatch_abs")
        }
        share = "-" if m["stale_share"] is None else f"{m['stale_share']:.1%}"
        lines.append(
            f"| {v} | {len(mine)} | {f(m['first_tenth'])} | {f(m['last_tenth'])} | {f(m['best_tenth'])} | "
            f"{share} | {f(m['lag_mean'], 2)} | {f(m['mismatch_abs'], 4)} |"
        )
    return "\n".join(lines) + "\n"


def compare(
    recipe: str,
    key: str,
    values: list[str],
    seeds: list[int],
    steps: int | None,
    out: Path,
    bootstrap: str | None,
    policy: str | None = None,
    extra: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Every seed over every value (seed-major, so a sweep cut short still compares like with like)."""
    base = yaml.safe_load((RECIPES / f"{recipe}.yaml").read_text())
    for k, v in (extra or {}).items():
        base = set_key(base, k, v)
    policy = policy or base.get("policies", [{"name": "policy"}])[0]["name"]
    rows = []
    for seed in seeds:
        for value in values:
            run_dir = out / f"{value}-seed{seed}"
            summary = run_recipe(set_key(seeded(base, seed), key, value), run_dir, steps, bootstrap)
            rows.append({"value": value, "seed": seed, **run_stats(run_dir, summary, policy)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def parse_value(text: str) -> Any:
    return yaml.safe_load(text)


def cli(
    argv: list[str] | None = None,
    recipe: str | None = None,
    key: str | None = None,
    values: str | None = None,
    name: str = "variants",
) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe", nargs="?" if recipe else None, default=recipe)
    ap.add_argument("--key", default=key, required=key is None, help="Dotted recipe key to vary.")
    ap.add_argument("--values", default=values, required=values is None, help="Comma-separated values.")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--policy", default=None)
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="Also set this in every run."
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--bootstrap", default=None)
    args = ap.parse_args(argv)
    out = args.out or REPO / "runs" / name / args.recipe
    extra = dict(item.split("=", 1) for item in args.set)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    rows = compare(
        args.recipe,
        args.key,
        [parse_value(v) for v in args.values.split(",")],
        seeds,
        args.steps,
        out,
        args.bootstrap,
        args.policy,
        {k: parse_value(v) for k, v in extra.items()},
    )
    machine = describe()
    text = f"machine: {machine}\n{args.recipe}, {args.steps or 'recipe'} steps, seeds {seeds}\n\n" + table(
        args.key, rows
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(
        json.dumps(
            {"machine": machine, "recipe": args.recipe, "key": args.key, "steps": args.steps, "rows": rows},
            indent=2,
        )
    )
    (out / f"{name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    cli()
