"""TRL's `GRPOTrainer` against `astraflow run`: the same task, init checkpoint, budget and settings.

The task is `recipes/arithmetic.yaml` with `feeder.env_args: {max_operand: 9, require_eos: true}`:
the 100 sums 0..9 + 0..9, reward 1 when the completion's token ids are exactly the answer then
<eos> (workers/envs/arithmetic.py; TRL's reward function calls that environment's `correct`; the
task, its reward and the greedy evaluation both halves share are in bench/sums.py).
Both runs start from one init checkpoint (astraflow.models.init_checkpoint of the recipe's model;
`astraflow run` gets it as `model.path`, TRL loads it with `from_pretrained`) and use lr 1e-4 (`--lr`), a
constant schedule, AdamW (0.9, 0.999, 1e-8), grad norm 1, 8 groups x 8 completions a step,
temperature 1, top_p 1, no KL, token-mean loss with clip 0.2 / 0.28, one gradient step per batch,
CPU, fp32. TRL's `max_completion_length` is the longest the environment allows (two answer digits
then <eos>: 3); the environment gives one-digit answers 2 tokens, a completion longer than that
scores 0 in both. Known difference: GRPO's std epsilon (ours 1e-6, TRL's 1e-4).

Reported for each: wall time of the whole run (process start to exit, as a user waits for it) and
of steps 2..N, completions/s over both, mean reward of the first and last tenth of the steps, and
the greedy accuracy over all 100 prompts of the final checkpoint loaded with
`AutoModelForCausalLM.from_pretrained` (astraflow: <run_dir>/trainer/solver/checkpoints/step-N).

TRL is the optional `bench` extra and never in the default install. Its dependencies clash with
the lock (see bench/RESULTS.md), so it lives in its own venv that also sees ours; the TRL half runs
there as a subprocess (`--trl-python`, by default /root/.cache/astraflow/venv-trl/bin/python):

    python -m bench.vs_trl [--steps 1000] [--lr 1e-4] [--seed 0] [--seeds 1] [--trl-python PATH]

Both systems' rewards depend on their seed (TRL's last tenth over seeds 0-4 ranged 0.29-0.49), so
`--seeds N` runs N pairs one after the other and ends with a summary over them: the speed ratio of
the summed times, and the last tenth's reward by seed and on average for each system.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.sums import ENV_ARGS, greedy_accuracy, max_completion_tokens, score, task_pool

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "arithmetic.yaml"
POLICY = "solver"
GROUPS, GROUP_SIZE, LR = 8, 8, 1.0e-4  # LR: the default of --lr
CLIP_LOW, CLIP_HIGH = 0.2, 0.28
DEFAULT_TRL_PYTHON = Path("/root/.cache/astraflow/venv-trl/bin/python")


# ---------------------------------------------------------------- astraflow half


def bench_recipe(base: dict[str, Any], init: Path, steps: int, lr: float = LR) -> dict[str, Any]:
    """The arithmetic recipe with the bench's task, budget and settings, starting from `init`."""
    data = copy.deepcopy(base)
    data["model"] = {"path": str(init)}
    data.setdefault("feeder", {}).update({"env_args": dict(ENV_ARGS), "group_size": GROUP_SIZE})
    data.setdefault("worker", {}).update({"temperature": 1.0, "top_p": 1.0, "top_k": 0})
    data.setdefault("trainer", {}).update(
        {
            "lr": lr,
            "batch_groups": GROUPS,
            "lr_decay": "none",
            "warmup_steps": 0,
            "weight_decay": 0.0,
            "betas": [0.9, 0.999],
            "eps": 1e-8,
            "max_grad_norm": 1.0,
        }
    )
    data["trainer"].setdefault("loss", {}).update(
        {
            "policy_loss": "ppo",
            "clip_low": CLIP_LOW,
            "clip_high": CLIP_HIGH,
            "aggregation": "token-mean",
            "kl_coef": 0.0,
            "entropy_coef": 0.0,
        }
    )
    data.setdefault("run", {})["max_steps"] = steps
    return data


def astraflow_metrics(run_dir: Path, steps: int) -> dict[str, Any]:
    """Per-step rewards and step times of the trainer, from the run's metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    by_step = {r["step"]: r for r in rows if r.get("component") == "trainer" and r.get("step", 0) >= 1}
    ordered = [by_step[s] for s in sorted(by_step)][:steps]
    if not ordered:
        raise RuntimeError(f"no trainer steps in {run_dir / 'metrics.jsonl'}")
    return {
        "steps": len(ordered),
        "steps_s": ordered[-1]["time"] - ordered[0]["time"],
        "rewards": [float(r["values"].get("reward.mean", float("nan"))) for r in ordered],
    }


def final_checkpoint(run_dir: Path) -> Path:
    """The trainer's last checkpoint (step-NNNNNNNN: the highest step sorts last)."""
    found = sorted((run_dir / "trainer" / POLICY / "checkpoints").glob("step-*"))
    if not found:
        raise RuntimeError(f"no checkpoint under {run_dir / 'trainer' / POLICY / 'checkpoints'}")
    return found[-1]


def timed_run(what: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> float:
    """Run `argv` in the repository with its output in `log`; the seconds it took. A failure names
    `what`, the log and its tail."""
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    total = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{what} exited {done.returncode}; see {log}:\n{log.read_text()[-3000:]}")
    return total


def run_astraflow(init: Path, steps: int, lr: float, work: Path, seed: int = 0) -> dict[str, Any]:
    from bench.learning_seeds import run_command, seeded

    recipe_file = work / "arithmetic-vs-trl.yaml"
    data = seeded(bench_recipe(yaml.safe_load(RECIPE.read_text()), init, steps, lr), seed)
    recipe_file.write_text(yaml.safe_dump(data))
    run_dir = work / "astraflow"
    # `astraflow run` resumes the run it finds in its run dir: an earlier bench's, already at its last
    # step, would end at once and be reported as this run (a reused --work did that once)
    shutil.rmtree(run_dir, ignore_errors=True)
    total = timed_run("astraflow run", run_command(recipe_file, run_dir, steps), work / "astraflow.log")
    return {
        "total_s": total,
        **astraflow_metrics(run_dir, steps),
        "checkpoint": str(final_checkpoint(run_dir)),
    }


# ---------------------------------------------------------------- TRL half (runs under --trl-python)


def trl_config(
    steps: int, out_dir: str, max_completion_length: int, seed: int, lr: float = LR
) -> dict[str, Any]:
    """GRPOConfig arguments matching the astraflow run (one 64-completion batch, one step)."""
    return {
        "output_dir": out_dir,
        "max_steps": steps,
        "seed": seed,
        "use_cpu": True,
        "bf16": False,
        "fp16": False,
        "learning_rate": lr,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "adam_epsilon": 1e-8,
        "max_grad_norm": 1.0,
        "per_device_train_batch_size": GROUPS * GROUP_SIZE,
        "gradient_accumulation_steps": 1,
        "num_generations": GROUP_SIZE,
        "num_iterations": 1,
        "beta": 0.0,
        "epsilon": CLIP_LOW,
        "epsilon_high": CLIP_HIGH,
        "loss_type": "dapo",
        "scale_rewards": "group",
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "max_completion_length": max_completion_length,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }


def trl_child(cfg: dict[str, Any]) -> dict[str, Any]:
    """Train with TRL in this process; returns per-step rewards and times."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from workers.envs.base import Codec, load_tokenizer

    init = cfg["init"]
    codec = Codec(load_tokenizer(init))
    tokenizer = AutoTokenizer.from_pretrained(init)
    pool = task_pool()
    # The workers' prompt is [<bos>, *ids(prompt)]; "<bos>" in the text is that special token.
    # TRL tokenizes plain-text prompts as `processing_class(text=prompts)`: check that call.
    got = tokenizer(text=["<bos>" + p for p, _ in pool])["input_ids"]
    want = [[codec.bos, *codec.ids(p)] for p, _ in pool]
    if got != want:
        raise RuntimeError(f"TRL's prompt ids {got[0]} differ from the workers' {want[0]}")
    dataset = Dataset.from_list([{"prompt": "<bos>" + p, "answer": a} for p, a in pool])

    def reward(completion_ids: list[list[int]], answer: list[str], **_: Any) -> list[float]:
        return score(completion_ids, answer, codec)

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            times.append(time.perf_counter())

    torch.manual_seed(cfg["seed"])
    model = AutoModelForCausalLM.from_pretrained(init, dtype=torch.float32)
    args = GRPOConfig(
        **trl_config(cfg["steps"], cfg["out"], max_completion_tokens(codec), cfg["seed"], cfg.get("lr", LR))
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.train()
    final = Path(cfg["out"]) / "final"
    trainer.save_model(str(final))
    tokenizer.save_pretrained(str(final))
    rewards = [float(h["reward"]) for h in trainer.state.log_history if "reward" in h]
    return {
        "steps": len(times),
        "steps_s": times[-1] - times[0],
        "rewards": rewards,
        "checkpoint": str(final),
    }


def run_trl(python: Path, init: Path, steps: int, seed: int, lr: float, work: Path) -> dict[str, Any]:
    if subprocess.run([str(python), "-c", "import trl"], capture_output=True).returncode:
        raise RuntimeError(
            f"{python} cannot import trl: install the `bench` extra into its own venv "
            "(bench/RESULTS.md, 'Against TRL') and pass its python as --trl-python"
        )
    cfg_file, result_file, log = work / "trl.json", work / "trl-result.json", work / "trl.log"
    cfg_file.write_text(
        json.dumps({"init": str(init), "steps": steps, "seed": seed, "lr": lr, "out": str(work / "trl")})
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "CUDA_VISIBLE_DEVICES": "",
        "TOKENIZERS_PARALLELISM": "false",
    }
    child = [
        str(python),
        "-m",
        "bench.vs_trl",
        "--trl-child",
        str(cfg_file),
        "--trl-result",
        str(result_file),
    ]
    total = timed_run("the TRL run", child, log, env)
    return {"total_s": total, **json.loads(result_file.read_text())}


# ---------------------------------------------------------------- report (evaluation: bench/sums.py)


def tenths(rewards: list[float]) -> tuple[float, float]:
    """Mean reward of the first and of the last tenth of the steps (at least one step each)."""
    if not rewards:
        return float("nan"), float("nan")
    k = max(1, len(rewards) // 10)
    return sum(rewards[:k]) / k, sum(rewards[-k:]) / k


def summary(r: dict[str, Any]) -> dict[str, float]:
    """The table's numbers for one run (completions = steps x 64)."""
    completions = r["steps"] * GROUPS * GROUP_SIZE
    first, last = tenths(r["rewards"])
    steps_rate = (
        (r["steps"] - 1) * GROUPS * GROUP_SIZE / r["steps_s"] if r["steps"] > 1 and r["steps_s"] > 0 else 0.0
    )
    return {
        "steps": r["steps"],
        "total_s": r["total_s"],
        "steps_s": r["steps_s"],
        "cps_total": completions / r["total_s"],
        "cps_steps": steps_rate,
        "reward_first": first,
        "reward_last": last,
        "greedy": r["greedy"],
    }


def table(results: dict[str, dict[str, Any]], machine: str, lr: float = LR) -> str:
    rows = {name: summary(r) for name, r in results.items()}
    lines = [
        f"machine: {machine}",
        f"task: arithmetic {ENV_ARGS}, {GROUPS} groups x {GROUP_SIZE} a step, lr {lr}, CPU fp32",
        f"{'system':10s} {'steps':>6s} {'total s':>8s} {'compl/s':>8s} {'steps2..N s':>12s} "
        f"{'compl/s':>8s} {'reward 1st 10%':>15s} {'reward last 10%':>16s} {'greedy acc':>11s}",
    ]
    for name, s in rows.items():
        lines.append(
            f"{name:10s} {s['steps']:6d} {s['total_s']:8.1f} {s['cps_total']:8.1f} {s['steps_s']:12.1f} "
            f"{s['cps_steps']:8.1f} {s['reward_first']:15.3f} {s['reward_last']:16.3f} {s['greedy']:11.2f}"
        )
    if "astraflow" in rows and "trl" in rows:
        a, t = rows["astraflow"], rows["trl"]
        lines.append(
            f"astraflow/TRL speed: {t['total_s'] / a['total_s']:.2f}x whole run, "
            f"{(a['cps_steps'] / t['cps_steps']) if t['cps_steps'] else float('nan'):.2f}x steps 2..N"
        )
    return "\n".join(lines)


def over_seeds(per_seed: dict[int, dict[str, dict[str, Any]]]) -> str:
    """Both systems over all seeds: summed times (so the speed ratio weighs every pair alike) and
    the last tenth's reward per seed, with its mean, against each other."""
    sums = {name: [summary(r[name]) for r in per_seed.values()] for name in ("trl", "astraflow")}
    seeds = list(per_seed)
    lines = [
        f"over seeds {', '.join(map(str, seeds))} (each pair one after the other):",
        f"{'system':10s} {'total s':>8s} {'steps2..N s':>12s} {'reward last 10% by seed':>30s} "
        f"{'mean':>6s} {'greedy mean':>12s}",
    ]
    for name, rows in sums.items():
        lasts = " ".join(f"{r['reward_last']:.3f}" for r in rows)
        lines.append(
            f"{name:10s} {sum(r['total_s'] for r in rows):8.1f} {sum(r['steps_s'] for r in rows):12.1f} "
            f"{lasts:>30s} {sum(r['reward_last'] for r in rows) / len(rows):6.3f} "
            f"{sum(r['greedy'] for r in rows) / len(rows):12.2f}"
        )
    t, a = sums["trl"], sums["astraflow"]
    ahead = sum(x["reward_last"] >= y["reward_last"] for x, y in zip(a, t, strict=True))

    def ratio(key: str) -> float:  # the same steps on both sides: the ratio of times is that of speeds
        return sum(r[key] for r in t) / sum(r[key] for r in a)

    lines.append(
        f"astraflow/TRL speed over all seeds: {ratio('total_s'):.2f}x whole runs, "
        f"{ratio('steps_s'):.2f}x steps 2..N; "
        f"last tenth at least TRL's in {ahead} of {len(seeds)} seeds"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--steps", type=int, default=1000, help="optimiser steps for each system (default 1000)"
    )
    parser.add_argument("--lr", type=float, default=LR, help=f"both systems' learning rate (default {LR})")
    parser.add_argument(
        "--seed", type=int, default=0, help="both systems' seed (astraflow: every seed of the recipe)"
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="pairs to run, seeds --seed, --seed + 1, ...; with more than one, a summary over them follows",
    )
    parser.add_argument(
        "--trl-python",
        type=Path,
        default=DEFAULT_TRL_PYTHON if DEFAULT_TRL_PYTHON.exists() else Path(sys.executable),
        help="a Python with the `bench` extra installed",
    )
    parser.add_argument(
        "--work", type=Path, default=None, help="keep runs and logs here (default: a temp dir)"
    )
    parser.add_argument("--trl-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--trl-result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trl_child:
        args.trl_result.write_text(json.dumps(trl_child(json.loads(args.trl_child.read_text()))))
        return
    if args.steps < 2:
        parser.error("--steps must be at least 2")
    from astraflow.config import load_recipe
    from astraflow.models import init_checkpoint
    from bench.machine import describe

    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    per_seed: dict[int, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        init = init_checkpoint(load_recipe(RECIPE).model_for(POLICY), work / "init")
        init_acc = greedy_accuracy(init)
        for seed in range(args.seed, args.seed + args.seeds):
            pair = work if args.seeds == 1 else work / f"seed-{seed}"
            pair.mkdir(parents=True, exist_ok=True)
            results = {
                "trl": run_trl(args.trl_python, init, args.steps, seed, args.lr, pair),
                "astraflow": run_astraflow(init, args.steps, args.lr, pair, seed),
            }
            for r in results.values():
                r["greedy"] = greedy_accuracy(r["checkpoint"])
            per_seed[seed] = results
            if args.seeds > 1:
                print(f"seed {seed}:")
            print(table(results, describe(), args.lr), flush=True)
    print(f"greedy accuracy of the init checkpoint: {init_acc:.2f}")
    if args.seeds > 1:
        print(over_seeds(per_seed))


if __name__ == "__main__":
    main()
