"""The task of bench/vs_trl.py, shared by its two halves (ours, and TRL's in its own interpreter):
the 100 sums 0..9 + 0..9 of workers/envs/arithmetic.py with `require_eos`, their reward exactly as the
environment gives it, and the greedy accuracy of a checkpoint on them. A module of the bench, not a
benchmark: bench/run_all.py runs only the `*_*.py` ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ENV_ARGS: dict[str, Any] = {"max_operand": 9, "require_eos": True}


def task_pool() -> list[tuple[str, str]]:
    """(prompt, answer) of every problem, from the environment's own generator (one epoch)."""
    from workers.envs.arithmetic import ArithmeticEnv

    pool = []
    for spec, epoch in ArithmeticEnv(**ENV_ARGS).tasks(0):
        if epoch:
            break
        assert spec.prompt is not None
        pool.append((spec.prompt, str(spec.payload["answer"])))
    return sorted(pool)


def max_completion_tokens(codec: Any) -> int:
    """The longest completion the environment allows on any prompt (answer digits, then <eos>)."""
    from workers.envs.arithmetic import ArithmeticEnv

    env = ArithmeticEnv(**ENV_ARGS)
    return max(env.turn_params({"answer": a}, codec)["max_tokens"] for _, a in task_pool())


def score(completion_ids: list[list[int]], answers: list[str], codec: Any) -> list[float]:
    """Rewards exactly as the environment gives them: 1.0 iff the ids are the answer then <eos>."""
    from workers.envs.arithmetic import ArithmeticEnv

    env = ArithmeticEnv(**ENV_ARGS)
    return [
        1.0 if env.correct({"answer": a}, list(ids), codec) else 0.0
        for ids, a in zip(completion_ids, answers, strict=True)
    ]


def greedy_accuracy(path: str | Path) -> float:
    """Share of the 100 prompts answered exactly (then <eos>) by greedy decoding, with the
    environment's own token budget and stop token, from `AutoModelForCausalLM.from_pretrained`."""
    import torch
    from transformers import AutoModelForCausalLM

    from workers.envs.arithmetic import ArithmeticEnv
    from workers.envs.base import Codec, load_tokenizer

    codec = Codec(load_tokenizer(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    env = ArithmeticEnv(**ENV_ARGS)
    pool = task_pool()
    prompts = [[codec.bos, *codec.ids(p)] for p, _ in pool]
    if len({len(p) for p in prompts}) != 1:
        raise ValueError("greedy_accuracy batches prompts of one length (single-digit operands)")
    ids = torch.tensor(prompts)
    with torch.no_grad():
        for _ in range(max_completion_tokens(codec)):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    correct = 0
    for row, (_, answer) in zip(ids.tolist(), pool, strict=True):
        state = {"answer": answer}
        gen = row[len(prompts[0]) :][: env.turn_params(state, codec)["max_tokens"]]
        if codec.eos in gen:
            gen = gen[: gen.index(codec.eos) + 1]
        correct += env.correct(state, gen, codec)
    return correct / len(pool)
