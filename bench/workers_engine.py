"""Worker tokens/s of the torch engine on the tiny model against a plain `model.generate` loop on the
same prompts (the baseline, measured in the same run), plus a batched `model.generate` call.

The engine serves N concurrent requests (as N episodes of a worker would) through its batching
KV-cache loop and also returns exact behaviour log-probs and per-token versions; the baseline
generates the same prompts one at a time with transformers' own sampling (no log-probs). Every
request generates exactly `--tokens` tokens (no stop token), so token counts are equal.

    python -m bench.workers_engine [--prompts 64] [--tokens 32] [--hidden 128 --layers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

import torch

from astraflow.config import ModelSpec
from astraflow.models import init_checkpoint, load_model
from bench.machine import describe
from workers.engines.base import SamplingParams
from workers.engines.torch_engine import TorchEngine
from workers.envs.base import Codec, load_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1, what each torch process of `astraflow run` gets on 2 cores)",
    )
    args = ap.parse_args()
    # One count for every method. With 2, the engine's thread ran 2-3x slower after the main thread's
    # `generate` calls had used torch's OpenMP threads (two thread teams on two cores).
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    spec = ModelSpec(
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=2 * args.hidden,
    )
    path = init_checkpoint(spec, tempfile.mkdtemp() + "/tiny")
    codec = Codec(load_tokenizer(path))
    prompts = [[codec.bos, *codec.ids(f"{a}+{b}=")] for a in range(8) for b in range(8)][: args.prompts]
    n_tokens = len(prompts) * args.tokens

    model = load_model(path, args.dtype).eval()
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.inference_mode():
        for p in prompts:
            model.generate(
                torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                do_sample=True,
                max_new_tokens=args.tokens,
                min_new_tokens=args.tokens,
                pad_token_id=codec.pad,
            )
    loop_s = time.perf_counter() - start

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[codec.pad] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None, :] >= (width - torch.tensor([len(p) for p in prompts]))[:, None]).long()
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            ids,
            attention_mask=mask,
            do_sample=True,
            max_new_tokens=args.tokens,
            min_new_tokens=args.tokens,
            pad_token_id=codec.pad,
        )
    batched_s = time.perf_counter() - start

    async def engine_run() -> float:
        engine = TorchEngine("p", str(path), dtype=args.dtype, max_batch=args.prompts)
        params = SamplingParams(max_tokens=args.tokens)
        # warm-up: the same requests once, untimed (the first wave of a new engine paid ~0.15 s of
        # one-time set-up; the generate loop above warms `generate` for the batched call)
        await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        start = time.perf_counter()
        results = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        took = time.perf_counter() - start
        assert sum(len(r.tokens) for r in results) == n_tokens
        await engine.close()
        return took

    engine_s = asyncio.run(engine_run())
    print(f"machine: {describe()}")
    print(
        f"model: hidden {args.hidden}, {args.layers} layers, {args.dtype}; {len(prompts)} prompts x "
        f"{args.tokens} tokens = {n_tokens} tokens; torch threads {torch.get_num_threads()}"
    )
    print("| | seconds | tokens/s | vs generate loop |\n|---|---:|---:|---:|")
    for name, s in (
        ("model.generate, one prompt at a time (baseline)", loop_s),
        ("model.generate, one left-padded batch", batched_s),
        ("torch engine, concurrent requests, with log-probs", engine_s),
    ):
        print(f"| {name} | {s:.2f} | {n_tokens / s:,.0f} | {loop_s / s:.1f}x |")


if __name__ == "__main__":
    main()
