"""A recipe (one policy or two) played synchronously in one process, for seed sweeps in minutes, not hours.

The same initial weights, torch engines, environment, workflow, GRPO advantages and trainer engine
as `astraflow run`, without Kafka: each step generates the step's groups with weights `--lag` steps
behind the trainers (the staleness an asynchronous run trains at), then takes one optimiser step
per policy. Success is the first policy's mean reward per step, judged as the run summary judges
it (`astraflow.runner.report.learning`: the best window of a tenth of the steps, and the last
tenth). A seed sets what `bench.learning_seeds` sets; each policy's engine gets its own sampler
seed, as each policy of a worker does.

    python -m bench.two_policy_sync [--recipe recipes/referential_game.yaml] [--seeds 0-9] [--lag 1]
        [--steps 300] [--set feeder.env_args.shared_randomness=false] [--policy-set listener:lr=1e-4]

Prints one line per seed: learned (best tenth >= 0.9 and last >= 0.7, the e2e test's bar), the
tenths, and each policy's entropy in the first, middle and last tenth; for solve_and_verify, also the
final verifier's accuracy on a balanced set of right and wrong answers (`verifier_accuracy`).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from astraflow.config import Recipe
from astraflow.models import init_checkpoint, load_model
from astraflow.runner.report import learning
from astraflow.sampling import SamplingSettings
from bench.e2e_sync_vs_async import samples_of
from bench.learning_seeds import seeded, set_key
from bench.machine import describe
from trainer.engine import TrainEngine
from trainer.rows import collate
from workers.engines.torch_engine import TorchEngine
from workers.envs.base import Codec, load_tokenizer
from workers.episodes import Runtime, run_episode
from workers.feeder import generated_tasks
from workers.startup import sampler_seed

REPO = Path(__file__).resolve().parent.parent


def tenths(values: list[float]) -> list[float]:
    n = len(values)
    return [float(np.mean(values[i * n // 10 : (i + 1) * n // 10])) for i in range(10)]


async def play(
    data: dict[str, Any],
    steps: int,
    lag: int,
    work: Path,
    per_policy: dict[str, dict[str, Any]],
    verifier_every: int = 0,
) -> dict[str, Any]:
    recipe = Recipe.model_validate(data)
    policies = recipe.policy_names
    init = {p: init_checkpoint(recipe.model_for(p), work / p) for p in policies}
    codec = Codec(load_tokenizer(init[policies[0]]))
    runtime = Runtime(recipe, codec)
    engines = {
        p: TorchEngine(
            p,
            str(init[p]),
            max_batch=recipe.worker.max_episodes * len(policies),
            seed=recipe.seed * 1_000_003 + sampler_seed("sync", p),
        )
        for p in policies
    }
    trainers = {}
    for p in policies:
        cfg = recipe.trainer_for(p).model_dump()
        for key, value in per_policy.get(p, {}).items():
            cfg = set_key(cfg, key, value)
        trainer_cfg = type(recipe.trainer).model_validate(cfg)
        trainers[p] = TrainEngine(
            load_model(init[p]),
            trainer_cfg,
            torch.device("cpu"),
            # the reference of a KL term: the initial weights, as the trainer service loads it
            ref_model=load_model(init[p]) if trainer_cfg.loss.kl_coef > 0 else None,
            pad_id=codec.pad,
            sampling=SamplingSettings.of(recipe.worker),
        )
    published: dict[str, deque[dict[str, torch.Tensor]]] = {p: deque() for p in policies}
    tasks = generated_tasks(recipe)
    success: list[float] = []
    rewards: dict[str, list[float]] = {p: [] for p in policies}
    entropy: dict[str, list[float]] = {p: [] for p in policies}
    for step in range(1, steps + 1):
        batch = [next(tasks) for _ in range(recipe.trainer.batch_groups)]
        results = await asyncio.gather(
            *(
                run_episode(runtime, t, k, engines, "sync", "local")
                for t in batch
                for k in range(t.group_size)
            )
        )
        groups: dict[str, list[Any]] = {}
        for trajs, _ in results:
            for t in trajs:
                groups.setdefault(t.group_id, []).append(t)
        for i, p in enumerate(policies):
            samples = [
                s
                for g in groups.values()
                for s in samples_of([t for t in g if p in t.rewards and t.policy_mask(p).any()], p)
            ]
            rewards[p].append(float(np.mean([s.reward for s in samples])))
            if i == 0:
                success.append(rewards[p][-1])
            out = trainers[p].step(
                collate(samples, codec.pad),
                step,
                float(sum(s.loss_mask.sum() for s in samples)),
                float(len(samples)),
            )
            entropy[p].append(out["entropy"])
            trainers[p].serving_published = True
            published[p].append(
                {k: v.detach().to(torch.bfloat16) for k, v in trainers[p].model.state_dict().items()}
            )
            if len(published[p]) > lag:
                await engines[p].update_weights(published[p].popleft(), step - lag)
        if verifier_every and step % verifier_every == 0 and "verifier" in trainers:
            acc = verifier_accuracy(trainers["verifier"].model, codec, recipe.feeder.env_args)
            print(
                f"  step {step}: rewards {[round(v[-1], 3) for v in rewards.values()]}, verifier {acc}",
                flush=True,
            )
    for e in engines.values():
        await e.close()
    await runtime.close()
    out = {
        "tenths": tenths(success),
        "judged": learning([{"reward.mean": x} for x in success]),
        "entropy": {p: [round(tenths(v)[i], 2) for i in (0, 4, 9)] for p, v in entropy.items()},
        "reward": {p: [round(tenths(v)[i], 3) for i in (0, 4, 9)] for p, v in rewards.items()},
    }
    if recipe.worker.workflow == "solve_and_verify" and "verifier" in trainers:
        out["verifier_balanced"] = verifier_accuracy(
            trainers["verifier"].model, codec, recipe.feeder.env_args
        )
    return out


def verifier_accuracy(model: torch.nn.Module, codec: Codec, env_args: dict[str, Any]) -> dict[str, float]:
    """A solve_and_verify verifier judged on a balanced set: every problem of the arithmetic task
    with its right answer and with every wrong answer of the same number of digits, as the workflow
    shows them (`<bos>a+b=` answer `?`); its arg-max verdict approves when it is `y`. Returns the
    share of right answers approved, of wrong answers rejected, and their mean (balanced accuracy:
    0.5 for a verifier that always approves or always rejects), and the mean probability of `y`
    on right and on wrong answers (how far an arg-max verdict is from changing)."""
    from workers.envs.arithmetic import ArithmeticEnv

    env = ArithmeticEnv(**env_args)
    yes = codec.ids("y")
    approved: list[bool] = []
    rejected: list[bool] = []
    p_yes: dict[bool, list[float]] = {True: [], False: []}
    model.eval()
    with torch.no_grad():
        for spec, epoch in env.tasks(0):
            if epoch:
                break
            assert spec.prompt is not None
            answer = str(spec.payload["answer"])
            first = 10 ** (len(answer) - 1) if len(answer) > 1 else 0
            for shown in map(str, range(first, 10 ** len(answer))):
                ids = [codec.bos, *codec.ids(spec.prompt), *codec.ids(shown), *codec.ids("?")]
                logits = model(torch.tensor([ids])).logits[0, -1]
                approves = [int(logits.argmax())] == yes
                right = shown == answer
                p_yes[right].append(float(torch.softmax(logits.float(), -1)[yes[0]]))
                (approved if right else rejected).append(approves == right)  # the verdict was correct
    model.train()
    right, wrong = float(np.mean(approved)), float(np.mean(rejected))
    return {
        "right_approved": right,
        "wrong_rejected": wrong,
        "balanced": (right + wrong) / 2,
        "p_yes_right": round(float(np.mean(p_yes[True])), 3),
        "p_yes_wrong": round(float(np.mean(p_yes[False])), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "referential_game.yaml")
    parser.add_argument("--seeds", default="0-9", help="first-last")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lag", type=int, default=1, help="steps the engines' weights trail the trainers'")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=YAML", help="recipe override")
    parser.add_argument(
        "--policy-set",
        action="append",
        default=[],
        metavar="POLICY:KEY=YAML",
        help="one policy's trainer override, e.g. listener:lr=1e-4",
    )
    parser.add_argument(
        "--verifier-every",
        type=int,
        default=0,
        metavar="N",
        help="solve_and_verify: judge the verifier every N steps",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    base = yaml.safe_load(args.recipe.read_text())
    for item in args.set:
        key, value = item.split("=", 1)
        base = set_key(base, key, yaml.safe_load(value))
    per_policy: dict[str, dict[str, Any]] = {}
    for item in args.policy_set:
        target, value = item.split("=", 1)
        policy, key = target.split(":", 1)
        per_policy.setdefault(policy, {})[key] = yaml.safe_load(value)
    first, last = (int(x) for x in args.seeds.split("-"))
    print(f"machine: {describe()}")
    learned = 0
    for seed in range(first, last + 1):
        torch.manual_seed(seed)
        start = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            r = asyncio.run(
                play(seeded(base, seed), args.steps, args.lag, Path(tmp), per_policy, args.verifier_every)
            )
        best, end = r["judged"]["best_tenth"], r["judged"]["last_tenth"]  # as the run summary has them
        ok = best >= 0.9 and end >= 0.7
        learned += ok
        print(
            f"seed {seed}: {'learned' if ok else 'NOT learned'}, best tenth {best:.3f}, last {end:.3f} "
            f"({time.time() - start:.0f} s); tenths {[round(x, 3) for x in r['tenths']]}; "
            f"entropy first/middle/last tenth {r['entropy']}; reward first/middle/last tenth {r['reward']}"
            + (f"; verifier on a balanced set {r['verifier_balanced']}" if "verifier_balanced" in r else ""),
            flush=True,
        )
    print(f"learned in {learned} of {last - first + 1} seeds")


if __name__ == "__main__":
    main()
