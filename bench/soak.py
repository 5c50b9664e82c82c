"""Soak: is memory flat over a long run? `astraflow run` of recipes/arithmetic.yaml (on a broker of
its own, started by the run) for `--minutes`, with the resident memory (VmRSS) of each of its
processes sampled every `--every` seconds. Bounded state (the trainer's dedupe window, the streams
caches and tables, the feeder's statistics) must show as a flat line once warm; a leak as a slope.

Prints, per process, its RSS once warm (the first sample after `--warmup` minutes), at the end, the
growth between them and the least-squares slope over the second half of the run (MiB per 10
minutes), with the machine and the trainer's steps; `--out` keeps every sample as JSON.

    PYTHONPATH=. python -m bench.soak [--minutes 30] [--every 30] [--warmup 5] [--out soak.json]
        [--dedupe-ttl S] [--dedupe-window N] [--pretouch]

The defaults keep a tombstone of every group for an hour (streams) and the last 100,000 groups
(trainer): their plateaus come after a 30-minute soak. `--dedupe-ttl 600 --dedupe-window 20000`
bring them inside it, so that every bound shows as a flat line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.machine import describe
from bench.proc_cpu import kind_of
from tests.conftest import REPO, subprocess_env
from tests.e2e.helpers import processes_of, trainer_steps
from tests.faults.harness import finish, start_run


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def sample(run_dir: Path) -> dict[str, float]:
    """RSS in MiB of each of the run's processes, by kind (summed over same-kind processes)."""
    out: dict[str, float] = {}
    for pid, cmd in processes_of(run_dir):
        rss = rss_mib(pid)
        if rss is not None:
            kind = kind_of(cmd, workers_apart=True)
            out[kind] = out.get(kind, 0.0) + rss
    return out


def slope_per_10min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB), in MiB per 10 minutes."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    return 600.0 * sum((t - mx) * (v - my) for t, v in points) / var if var else 0.0


def table(samples: list[dict[str, Any]], warmup_s: float) -> list[str]:
    kinds = sorted({k for s in samples for k in s["rss"]})
    end = samples[-1]["t"]
    lines = [f"{'process':16s} {'warm MiB':>9s} {'end MiB':>8s} {'growth':>8s} {'slope 2nd half':>15s}"]
    for kind in kinds:
        points = [(s["t"], s["rss"][kind]) for s in samples if kind in s["rss"]]
        warm = next((v for t, v in points if t >= warmup_s), points[0][1])
        last = points[-1][1]
        slope = slope_per_10min([(t, v) for t, v in points if t >= end / 2])
        lines.append(f"{kind:16s} {warm:9.1f} {last:8.1f} {last - warm:+8.1f} {slope:+11.1f}/10m")
    return lines


def soak_recipe(data: dict[str, Any], dedupe_ttl: float | None, dedupe_window: int | None) -> dict[str, Any]:
    """The recipe `data` without a step limit, with the soak's dedupe bounds where given."""
    data = {**data, "run": {**(data.get("run") or {}), "max_steps": None}}
    if dedupe_ttl is not None:
        streams = data.get("streams") or {}
        group = {**(streams.get("group") or {}), "dedupe_ttl_s": dedupe_ttl}
        data["streams"] = {**streams, "group": group}
    if dedupe_window is not None:
        data["trainer"] = {**data["trainer"], "dedupe_window": dedupe_window}
    return data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=5.0, help="minutes before memory counts as warm")
    ap.add_argument("--out", type=Path, help="write every sample here (JSON)")
    ap.add_argument(
        "--dedupe-ttl",
        type=float,
        help="streams' group dedupe_ttl_s (default the recipe's, 1 h): shorter, its tombstones plateau "
        "in the soak",
    )
    ap.add_argument("--dedupe-window", type=int, help="trainer.dedupe_window (default 100,000 groups)")
    ap.add_argument(
        "--pretouch",
        action="store_true",
        help="the broker JVM touches its whole fixed heap at start (-XX:+AlwaysPreTouch), so that its RSS "
        "is the heap from the first sample and only the rest of its memory can grow",
    )
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="astraflow-soak-"))
    data = yaml.safe_load((REPO / "recipes" / "arithmetic.yaml").read_text())
    recipe = work / "arithmetic.yaml"
    recipe.write_text(yaml.safe_dump(soak_recipe(data, args.dedupe_ttl, args.dedupe_window)))
    run_dir = work / "run"
    env = subprocess_env()  # no ASTRAFLOW_BOOTSTRAP: the run starts its own broker, whose memory counts too
    if args.pretouch:
        env["JAVA_TOOL_OPTIONS"] = (env.get("JAVA_TOOL_OPTIONS", "") + " -XX:+AlwaysPreTouch").strip()
    proc = start_run(recipe, run_dir, env, "--max-minutes", str(args.minutes))
    t0 = time.monotonic()
    samples: list[dict[str, Any]] = []
    events = run_dir / "events.log"
    while proc.poll() is None:
        if events.exists() and "stopping:" in events.read_text(errors="replace"):
            break  # what the run does at its end (the report and its plots) is not the steady state
        rss = sample(run_dir)
        if rss:
            samples.append(
                {"t": time.monotonic() - t0, "rss": rss, "steps": trainer_steps(run_dir, "solver")}
            )
            print(
                f"[soak] {samples[-1]['t']:6.0f} s  steps {samples[-1]['steps']:6d}  "
                + "  ".join(f"{k} {v:.0f}" for k, v in sorted(rss.items())),
                flush=True,
            )
        time.sleep(args.every)
    out = finish(proc, 600)
    if proc.returncode != 0 or len(samples) < 3:
        print(out[-3000:])
        return 1
    print(f"machine: {describe()}")
    print(
        f"recipe: arithmetic, {args.minutes:g} min, {samples[-1]['steps']} trainer steps, RSS sampled every "
        f"{args.every:g} s (warm after {args.warmup:g} min)"
    )
    print(
        f"dedupe_ttl_s {args.dedupe_ttl if args.dedupe_ttl is not None else 'recipe'}, dedupe_window "
        f"{args.dedupe_window if args.dedupe_window is not None else 'default'}, broker heap pre-touched: "
        f"{'yes' if args.pretouch else 'no'}"
    )
    print("\n".join(table(samples, args.warmup * 60)))
    if args.out:
        args.out.write_text(json.dumps({"minutes": args.minutes, "samples": samples}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
