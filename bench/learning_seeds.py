"""Does each CPU recipe learn on every seed? `astraflow run` of recipes/*.yaml (not recipes/gpu/)
over N seeds, judged per recipe against the targets of issue 12, with a JSON and a markdown summary.

A seed sets everything a recipe seeds: `seed` (streams), `model.seed` (the initial weights, of every
policy built from scratch), `feeder.seed` (task order) and the torch engine's sampler seed. Runs are
asynchronous, so two runs of one seed still differ in timing (which version generated what); the
seed fixes the initial weights, the tasks and the sampler streams, not the interleaving.

What "learns" means for each recipe (`TARGETS`): the issue's target where it names one, else a
rise of the reward from the first to the last tenth of the steps that the run summary's
permutation test finds significant (p < 0.05, astraflow/runner/report.py):
- referential_game: both policies reach a best tenth of success >= 0.9;
- guess_number: the agent's best tenth of success >= 0.8;
- solve_and_verify: the solver's reward rises and the verifier's final checkpoint judges a balanced
  set (every problem with its right answer and every wrong one of as many digits) with an arg-max
  balanced accuracy >= 0.9 (bench.two_policy_sync.verifier_accuracy, read back as
  `policies.verifier.balanced.accuracy`); its reward, the accuracy of its *sampled* verdicts, stays
  lower: the entropy target that keeps both verdicts sampled holds it near 0.8;
- addition (the full addition task of bench.vs_trl): greedy accuracy of the final checkpoint on the
  100 sums >= 0.9 (`bench.sums.greedy_accuracy`, read back as `policies.solver.greedy.accuracy`);
- arithmetic, search, code: the reward rises.

    python -m bench.learning_seeds [--seeds 20] [--first-seed 0] [--recipes guess_number,arithmetic]
        [--steps N] [--out runs/learning_seeds] [--bootstrap HOST:PORT]

Each run is `<out>/<recipe>/seed-<k>`; a run whose summary.json exists is read, not rerun, so an
interrupted sweep continues where it stopped. `<out>/learning_seeds.json` and `.md` hold the result.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.machine import describe

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "recipes"
RISE_P = 0.05


@dataclass(frozen=True)
class Target:
    """One condition on a policy's run summary: `policies.<policy>.<metric>.<stat> <op> <value>`."""

    policy: str
    metric: str  # "reward", "success", or a CHECKPOINT_MEASURES metric ("greedy", "balanced")
    stat: str  # "best_tenth", "last_tenth", "first_tenth", "p_value", "improvement"; a measure's: "accuracy"
    op: str  # ">=" or "<"
    value: float

    def holds(self, summary: dict[str, Any]) -> bool:
        got = value_of(summary, self.policy, self.metric, self.stat)
        if got is None:
            return False
        return got >= self.value if self.op == ">=" else got < self.value

    def describe(self) -> str:
        return f"{self.policy} {self.metric}.{self.stat} {self.op} {self.value:g}"


def rises(policy: str) -> list[Target]:
    """A significant rise of the reward from the first to the last tenth."""
    return [
        Target(policy, "reward", "p_value", "<", RISE_P),
        Target(policy, "reward", "improvement", ">=", 1e-9),
    ]


TARGETS: dict[str, list[Target]] = {
    "referential_game": [
        Target("speaker", "success", "best_tenth", ">=", 0.9),
        Target("listener", "success", "best_tenth", ">=", 0.9),
    ],
    "guess_number": [Target("agent", "success", "best_tenth", ">=", 0.8)],
    "solve_and_verify": [*rises("solver"), Target("verifier", "balanced", "accuracy", ">=", 0.9)],
    "addition": [Target("solver", "greedy", "accuracy", ">=", 0.9)],
    "arithmetic": rises("solver"),
    "search": rises("agent"),
    "code": rises("coder"),
}


def greedy(final: Path) -> float:
    """bench.sums' greedy accuracy of a checkpoint on the 100 sums."""
    from bench.sums import greedy_accuracy

    return greedy_accuracy(final)


def balanced(final: Path) -> float:
    """A solve_and_verify verifier checkpoint's arg-max balanced accuracy (recipes/solve_and_verify.yaml's
    task), bench.two_policy_sync.verifier_accuracy."""
    from transformers import AutoModelForCausalLM

    from bench.two_policy_sync import verifier_accuracy
    from workers.envs.base import Codec, load_tokenizer

    env_args = yaml.safe_load((RECIPES / "solve_and_verify.yaml").read_text())["feeder"].get("env_args") or {}
    model = AutoModelForCausalLM.from_pretrained(final)
    return verifier_accuracy(model, Codec(load_tokenizer(final)), env_args)["balanced"]


#: Recipes also judged on their final checkpoint: recipe -> (policy, metric, measure of a checkpoint).
CHECKPOINT_MEASURES: dict[str, tuple[str, str, Any]] = {
    "addition": ("solver", "greedy", greedy),
    "solve_and_verify": ("verifier", "balanced", balanced),
}


def with_measure(summary: dict[str, Any], run_dir: Path, recipe: str) -> dict[str, Any]:
    """`summary` with `policies.<policy>.<metric>.accuracy` of the recipe's CHECKPOINT_MEASURES entry,
    measured on the run's final checkpoint once and kept in the run directory as <metric>.json."""
    from trainer.checkpoint import latest_checkpoint

    policy, metric, measure = CHECKPOINT_MEASURES[recipe]
    kept = run_dir / f"{metric}.json"
    if not kept.exists():
        final = latest_checkpoint(run_dir / "trainer" / policy / "checkpoints")  # complete ones only
        kept.write_text(json.dumps({"accuracy": measure(final) if final else None}))
    summary = copy.deepcopy(summary)
    summary.setdefault("policies", {}).setdefault(policy, {})[metric] = json.loads(kept.read_text())
    return summary


def value_of(summary: dict[str, Any], policy: str, metric: str, stat: str) -> float | None:
    got = summary.get("policies", {}).get(policy, {}).get(metric, {}).get(stat)
    return float(got) if isinstance(got, int | float) and math.isfinite(got) else None


def targets_for(recipe: str, policies: list[str]) -> list[Target]:
    """The recipe's targets; a recipe not in TARGETS learns when every policy's reward rises."""
    return TARGETS.get(recipe) or [t for p in policies for t in rises(p)]


def judge(recipe: str, policies: list[str], summary: dict[str, Any]) -> dict[str, Any]:
    """One run: did it learn, and which targets failed."""
    failed = [t.describe() for t in targets_for(recipe, policies) if not t.holds(summary)]
    if summary.get("failed"):
        failed.insert(0, f"components failed: {summary['failed']}")
    measured, metric, _ = CHECKPOINT_MEASURES.get(recipe, (None, "", None))
    stats = {
        p: {
            f"{m}.{s}": value_of(summary, p, m, s)
            for m in ("reward", "success")
            for s in ("first_tenth", "last_tenth", "best_tenth", "p_value")
        }
        | ({f"{metric}.accuracy": value_of(summary, p, metric, "accuracy")} if p == measured else {})
        for p in policies
    }
    return {
        "learned": not failed,
        "failed_targets": failed,
        "stats": stats,
        "steps": {p: summary.get("policies", {}).get(p, {}).get("steps") for p in policies},
    }


def tally(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per recipe: seeds run, seeds that learned, and which seeds did not."""
    out: dict[str, dict[str, Any]] = {}
    for r in results:
        t = out.setdefault(r["recipe"], {"runs": 0, "learned": 0, "not_learned": [], "targets": r["targets"]})
        t["runs"] += 1
        if r["learned"]:
            t["learned"] += 1
        else:
            t["not_learned"].append(r["seed"])
    return out


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| recipe | learned / seeds | seeds that did not | learns when |", "|---|---:|---|---|"]
    for recipe, t in tally(results).items():
        missed = ", ".join(str(s) for s in t["not_learned"]) or "-"
        lines.append(f"| {recipe} | {t['learned']} / {t['runs']} | {missed} | {'; '.join(t['targets'])} |")
    lines += [
        "",
        (
            "| recipe | seed | policy | reward first / last / best tenth "
            "| success first / last / best tenth | learned |"
        ),
        "|---|---:|---|---|---|---|",
    ]

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    for r in results:
        for p, s in r["stats"].items():
            lines.append(
                f"| {r['recipe']} | {r['seed']} | {p} | {f(s['reward.first_tenth'])} / "
                f"{f(s['reward.last_tenth'])} / {f(s['reward.best_tenth'])} | "
                f"{f(s['success.first_tenth'])} / {f(s['success.last_tenth'])} / "
                f"{f(s['success.best_tenth'])} | "
                f"{'yes' if r['learned'] else 'no: ' + '; '.join(r['failed_targets'])}"
                + "".join(f" ({k.split('.')[0]} {f(v)})" for k, v in s.items() if k.endswith(".accuracy"))
                + " |"
            )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- running recipes (shared by the benches)


def cpu_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES.glob("*.yaml"))


def seeded(data: dict[str, Any], seed: int) -> dict[str, Any]:
    """The recipe with every seed it has set to `seed` (see the module docstring)."""
    data = copy.deepcopy(data)
    data["seed"] = seed
    model = data.setdefault("model", {})
    if "path" not in model:
        model["seed"] = seed
    for policy in data.get("policies", []):
        if policy.get("model") and "path" not in policy["model"]:
            policy["model"]["seed"] = seed
    data.setdefault("feeder", {})["seed"] = seed
    engine = data.setdefault("worker", {}).setdefault("engine", {})
    if engine.get("type", "torch") == "torch":
        engine.setdefault("args", {})["seed"] = seed
    return data


def set_key(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """`set_key(d, "trainer.loss.policy_loss", "m2po")` on a copy."""
    data = copy.deepcopy(data)
    node = data
    *parents, last = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return data


def run_command(recipe_file: Path, run_dir: Path, steps: int | None = None) -> list[str]:
    """argv of `astraflow run` of `recipe_file` into `run_dir`, no dashboard, in this interpreter;
    `steps`: --max-steps (None: the recipe's own end). The benchmarks that time whole runs share it."""
    cmd = [
        sys.executable,
        "-m",
        "astraflow.cli",
        "run",
        str(recipe_file),
        "--run-dir",
        str(run_dir),
        "--no-dashboard",
    ]
    if steps is not None:
        cmd += ["--max-steps", str(steps)]
    return cmd


def run_recipe(
    data: dict[str, Any], run_dir: Path, steps: int | None, bootstrap: str | None = None
) -> dict[str, Any]:
    """`astraflow run` of a recipe dict into `run_dir` (its own broker unless `bootstrap`, then a
    fresh topic namespace); returns summary.json, or reads it when the run was done before."""
    summary_file = run_dir / "summary.json"
    if summary_file.exists():
        return json.loads(summary_file.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    data = copy.deepcopy(data)
    if bootstrap:
        data["kafka"] = {
            **data.get("kafka", {}),
            "bootstrap": bootstrap,
            "namespace": f"b{uuid.uuid4().hex[:10]}",
        }
    recipe_file = run_dir.parent / f"{run_dir.name}.yaml"  # the run copies it to run_dir/recipe.yaml
    recipe_file.write_text(yaml.safe_dump(data, sort_keys=False))
    cmd = run_command(recipe_file, run_dir, steps or None)
    with (run_dir / "run.log").open("w") as log:
        # every component imports this checkout, whatever directory the supervisor starts it in
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    if not summary_file.exists():
        raise RuntimeError(
            f"astraflow run exited {done.returncode} without a summary; see {run_dir / 'run.log'}"
        )
    return json.loads(summary_file.read_text())


def sweep(
    recipes: list[str], seeds: list[int], steps: int | None, out: Path, bootstrap: str | None
) -> list[dict[str, Any]]:
    results = []
    for name in recipes:
        base = yaml.safe_load((RECIPES / f"{name}.yaml").read_text())
        policies = [p["name"] for p in base.get("policies", [{"name": "policy"}])]
        for seed in seeds:
            run_dir = out / name / f"seed-{seed}"
            summary = run_recipe(seeded(base, seed), run_dir, steps, bootstrap)
            if name in CHECKPOINT_MEASURES:
                summary = with_measure(summary, run_dir, name)
            verdict = judge(name, policies, summary)
            results.append(
                {
                    "recipe": name,
                    "seed": seed,
                    **verdict,
                    "targets": [t.describe() for t in targets_for(name, policies)],
                    "wall_minutes": summary.get("wall_minutes"),
                }
            )
            print(
                f"{name} seed {seed}: {'learned' if verdict['learned'] else 'did not learn'} "
                f"{verdict['failed_targets'] or ''}",
                flush=True,
            )
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20, help="How many seeds (first-seed, first-seed + 1, ...).")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument(
        "--recipes", default=None, help="Comma-separated recipe names (default: every CPU recipe)."
    )
    ap.add_argument(
        "--steps", type=int, default=None, help="Steps per run (default: each recipe's run.max_steps)."
    )
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "learning_seeds")
    ap.add_argument("--bootstrap", default=None, help="Share one running broker (a fresh namespace per run).")
    args = ap.parse_args(argv)
    known = cpu_recipes()
    args.recipes = args.recipes.split(",") if args.recipes else known
    unknown = sorted(set(args.recipes) - set(known))
    if unknown:
        ap.error(f"unknown recipes {unknown}; known: {', '.join(known)}")
    if args.seeds < 1:
        ap.error("--seeds must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    results = sweep(args.recipes, seeds, args.steps, args.out, args.bootstrap)
    args.out.mkdir(parents=True, exist_ok=True)
    machine = describe()
    (args.out / "learning_seeds.json").write_text(
        json.dumps(
            {"machine": machine, "results": results, "tally": tally(results), "steps": args.steps}, indent=2
        )
    )
    table = f"machine: {machine}\nsteps: {args.steps or 'each recipe its own'}\n\n" + markdown(results)
    (args.out / "learning_seeds.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
