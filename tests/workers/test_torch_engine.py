"""The torch engine: exact behaviour log-probs, batching, weight swaps between decode steps."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from workers.engines.base import SamplingParams
from workers.engines.sampling import sampling_logprobs
from workers.engines.torch_engine import TorchEngine, WeightLoadError


def teacher_forced(engine: TorchEngine, prompt: list[int], tokens: list[int], t: float, p: float) -> torch.Tensor:
    seq = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = engine.model(seq).logits[0, len(prompt) - 1:-1].float()
    n = len(tokens)
    lp = sampling_logprobs(logits, torch.full((n,), t), torch.full((n,), p))
    return lp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_logprobs_match_teacher_forcing(tiny_checkpoint: Path, temperature: float, top_p: float) -> None:
    async def main() -> float:
        engine = TorchEngine("p", str(tiny_checkpoint), seed=3)
        # prompts of different lengths batch together (left padding)
        prompts = [[1] + list(range(5, 5 + n)) for n in (1, 3, 6, 9, 2, 12)]
        params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=24, stop_token_ids=(2,))
        results = await asyncio.gather(*(engine.generate(pr, params) for pr in prompts))
        worst = 0.0
        for pr, r in zip(prompts, results, strict=True):
            assert len(r.tokens) == len(r.logprobs) == len(r.versions) > 0
            assert r.finish_reason in ("stop", "length")
            ref = teacher_forced(engine, pr, r.tokens, temperature, top_p)
            worst = max(worst, (ref - torch.tensor(r.logprobs)).abs().max().item())
        # the waves really batched: fewer forward passes than tokens generated
        assert engine.forwards < sum(len(r.tokens) for r in results)
        await engine.close()
        return worst

    assert asyncio.run(main()) <= 1e-4


def test_stop_and_length(tiny_checkpoint: Path) -> None:
    async def main() -> None:
        engine = TorchEngine("p", str(tiny_checkpoint), seed=0)
        every = tuple(range(100))  # any token stops
        r = await engine.generate([1, 5], SamplingParams(max_tokens=10, stop_token_ids=every))
        assert len(r.tokens) == 1 and r.finish_reason == "stop"
        r = await engine.generate([1, 5], SamplingParams(max_tokens=3))
        assert len(r.tokens) == 3 and r.finish_reason == "length"
        # a prompt that fills the context gets nothing more
        r = await engine.generate([1] * engine.max_positions, SamplingParams(max_tokens=3))
        assert r.tokens == [] and r.finish_reason == "length"
        await engine.close()

    asyncio.run(main())


def test_weight_swap_mid_trajectory(tiny_checkpoint: Path) -> None:
    """Version 1 zeroes the final norm: its logits are all 0, so every token it generates has
    log-prob exactly -log(V); tokens before the swap carry version 0 and ordinary log-probs."""

    async def main() -> None:
        engine = TorchEngine("p", str(tiny_checkpoint), seed=1)
        vocab = engine.model.config.vocab_size
        state = {k: v.clone() for k, v in engine.model.state_dict().items()}
        state["model.norm.weight"] = torch.zeros_like(state["model.norm.weight"])
        swap_at = 4  # forward passes before the swap: prefill + 3 decode steps

        def hook(step: int) -> None:
            if step == swap_at:
                engine.queue_update(state, 1)

        engine.step_hook = hook
        r = await engine.generate([1, 7, 8], SamplingParams(max_tokens=10))
        assert r.versions == [0] * swap_at + [1] * (10 - swap_at)
        uniform = -torch.log(torch.tensor(float(vocab))).item()
        assert all(abs(lp - uniform) < 1e-5 for lp in r.logprobs[swap_at:])
        assert all(abs(lp - uniform) > 1e-3 for lp in r.logprobs[:swap_at])
        assert engine.version == 1
        await engine.close()

    asyncio.run(main())


def test_bad_weights_are_refused_and_the_old_ones_kept(tiny_checkpoint: Path) -> None:
    async def main() -> None:
        engine = TorchEngine("p", str(tiny_checkpoint))
        before = {k: v.clone() for k, v in engine.model.state_dict().items()}
        bad_shape = {**before, "model.norm.weight": torch.zeros(3)}
        with pytest.raises(WeightLoadError, match="shape"):
            await engine.update_weights(bad_shape, 5)
        with pytest.raises(WeightLoadError, match="unknown"):
            await engine.update_weights({**before, "nonsense": torch.zeros(3)}, 5)
        with pytest.raises(WeightLoadError, match="missing"):
            await engine.update_weights({"model.norm.weight": torch.zeros_like(before["model.norm.weight"])}, 5)
        assert engine.version == 0
        assert all(torch.equal(before[k], v) for k, v in engine.model.state_dict().items())
        await engine.close()

    asyncio.run(main())


def test_cancelled_request_is_dropped(tiny_checkpoint: Path) -> None:
    async def main() -> None:
        engine = TorchEngine("p", str(tiny_checkpoint))
        task = asyncio.create_task(engine.generate([1, 5], SamplingParams(max_tokens=100)))
        other = asyncio.create_task(engine.generate([1, 6], SamplingParams(max_tokens=5)))
        await asyncio.sleep(0)
        task.cancel()
        assert len((await other).tokens) == 5
        with pytest.raises(asyncio.CancelledError):
            await task
        await engine.close()

    asyncio.run(main())


def test_bfloat16_runs(tiny_checkpoint: Path) -> None:
    async def main() -> None:
        engine = TorchEngine("p", str(tiny_checkpoint), dtype="bfloat16")
        r = await engine.generate([1, 5, 6], SamplingParams(max_tokens=8))
        assert len(r.tokens) == 8 and all(lp <= 0 for lp in r.logprobs)
        await engine.close()

    asyncio.run(main())
