"""Episode throughput of a worker's episode layer with tool latency, at 1, 8 and 64 concurrent
episodes (the baseline is 1, measured in the same run).

Each episode is multi-turn (`--turns` model turns of `--gen` tokens on the real torch engine, the
tiny model) and every turn ends in a tool call that takes `--latency` seconds, as a search or code
sandbox would. With more episodes in flight the engine batches their turns and the tool waits
overlap, which is what `worker.max_episodes` buys. The tool is a bench-local environment registered
in the plug-in registry, run by the built-in `agent` workflow.

    python -m bench.workers_episodes [--latency 0.05] [--turns 3] [--episodes 128]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from typing import Any

from pydantic import Field

from astraflow.config import ModelSpec, Recipe, StrictModel
from astraflow.models import init_checkpoint
from astraflow.records import Task
from bench.machine import describe
from workers.engines.torch_engine import TorchEngine
from workers.envs.base import Codec, Environment, Step, load_tokenizer
from workers.episodes import Runtime, run_episode
from workers.registry import environments


class ToolEnv(Environment):
    """Every model turn is a tool call of fixed latency; the episode ends after `turns` calls."""

    name = "bench_tool"

    class Args(StrictModel):
        latency_s: float = Field(default=0.05, ge=0)
        turns: int = Field(default=3, ge=1)
        gen: int = Field(default=8, ge=1)

    def reset(self, task: Task, codec: Codec, rng: random.Random) -> tuple[Any, str]:
        return {"turns": 0}, "q:"

    def turn_params(self, state: Any, codec: Codec) -> dict[str, Any]:
        return {"max_tokens": self.args.gen, "stop_token_ids": ()}

    async def step(self, state: Any, action: list[int], codec: Codec) -> Step:
        await asyncio.sleep(self.args.latency_s)
        state["turns"] += 1
        if state["turns"] >= self.args.turns:
            return Step(reward=1.0, done=True)
        return Step(observation="r:")


async def throughput(runtime: Runtime, engine: TorchEngine, concurrency: int, episodes: int) -> float:
    sem = asyncio.Semaphore(concurrency)
    task = Task(task_id="bench", env="bench_tool", roles={"agent": "p"}, group_size=episodes)

    async def one(k: int) -> None:
        async with sem:
            trajs, _ = await run_episode(runtime, task, k, {"p": engine}, "bench", "local")
            assert trajs[0].finish_reason == "stop", trajs[0].error

    start = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(episodes)))
    return episodes / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--gen", type=int, default=8)
    ap.add_argument("--episodes", type=int, default=128)
    args = ap.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    environments()["bench_tool"] = ToolEnv
    path = init_checkpoint(ModelSpec(), tempfile.mkdtemp() + "/tiny")
    recipe = Recipe.model_validate(
        {
            "name": "bench",
            "policies": [{"name": "p"}],
            "worker": {
                "env_args": {"bench_tool": {"latency_s": args.latency, "turns": args.turns, "gen": args.gen}}
            },
        }
    )
    runtime = Runtime(recipe, Codec(load_tokenizer(path)))

    async def run() -> dict[int, float]:
        engine = TorchEngine("p", str(path), max_batch=64)
        out = {}
        for c in (1, 8, 64):
            n = max(16, args.episodes if c > 1 else args.episodes // 8)
            out[c] = await throughput(runtime, engine, c, n)
        await engine.close()
        return out

    rates = asyncio.run(run())
    print(f"machine: {describe()}")
    print(
        f"tiny model (hidden 128, 4 layers, float32); {args.turns} turns x {args.gen} tokens per episode, "
        f"tool latency {args.latency * 1000:.0f} ms per turn"
    )
    print("| concurrent episodes | episodes/s | vs 1 |\n|---:|---:|---:|")
    for c, r in rates.items():
        print(f"| {c} | {r:.1f} | {r / rates[1]:.1f}x |")


if __name__ == "__main__":
    main()
