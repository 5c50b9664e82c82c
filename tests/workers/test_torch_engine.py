"""The torch engine: exact behaviour log-probs, batching, weight swaps between decode steps and the
versions they stamp."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from astraflow.sampling import sampling_logprobs
from workers.engines import torch_engine
from workers.engines.base import SamplingParams
from workers.engines.torch_engine import TorchEngine, WeightLoadError
from workers.engines.waves import Request, hand_back


def teacher_forced(
    engine: TorchEngine, prompt: list[int], tokens: list[int], t: float, p: float, k: int = 0
) -> torch.Tensor:
    seq = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = engine.model(seq).logits[0, len(prompt) - 1 : -1].float()
    lp = sampling_logprobs(logits, t, p, k)
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


def test_a_request_joins_a_running_wave(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request submitted while a long wave decodes is served at the next decode step, with
    log-probs still exact for both (their KV caches are merged with different padding).

    The forward passes are counted in the engine thread (when the request is first seen pending and
    when it is handed back), not when the event loop gets to run: on a loaded machine the loop may
    wake many decode steps after the engine resolved the future."""
    finished_at: dict[tuple[int, ...], int] = {}
    seen_at: list[int] = []

    def record_hand_back(done: list[Request]) -> None:
        for req in done:
            finished_at[tuple(req.prompt)] = engine.forwards
        hand_back(done)

    monkeypatch.setattr(torch_engine, "hand_back", record_hand_back)
    engine = TorchEngine("p", str(tiny_checkpoint), seed=4)
    long_prompt, short_prompt = [1, 5, 6, 7, 8, 9, 10, 11], [1, 12]

    take_pending = engine._take_pending

    def watch(room: int) -> list[Request]:
        taken = take_pending(room)
        if any(tuple(r.prompt) == tuple(short_prompt) for r in taken):
            seen_at.append(engine.forwards)
        return taken

    monkeypatch.setattr(engine, "_take_pending", watch)

    async def main() -> None:
        params = SamplingParams(temperature=1.0, max_tokens=40)
        first = asyncio.create_task(engine.generate(long_prompt, params))
        while engine.forwards < 4:  # the first wave is decoding
            await asyncio.sleep(0.001)
        second = await engine.generate(short_prompt, SamplingParams(temperature=0.8, top_p=0.9, max_tokens=3))
        result = await first
        await engine.close()
        assert len(result.tokens) == 40 and len(second.tokens) == 3
        for prompt, r, t, p in ((long_prompt, result, 1.0, 1.0), (short_prompt, second, 0.8, 0.9)):
            ref = teacher_forced(engine, prompt, r.tokens, t, p)
            assert (ref - torch.tensor(r.logprobs)).abs().max().item() <= 1e-4

    asyncio.run(main())
    short_done, long_done = finished_at[tuple(short_prompt)], finished_at[tuple(long_prompt)]
    assert short_done < long_done, "the second request waited for the first wave to end"
    # taken into the running wave, then a prefill of its own and two shared decode steps
    assert seen_at and short_done <= seen_at[0] + 3, (seen_at, short_done)


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


def test_weight_swap_mid_wave_stamps_the_oldest_version(tiny_checkpoint: Path) -> None:
    """Version 1 zeroes the final norm: its logits are all 0, so every token it samples has log-prob
    exactly -log(V). The swap lands mid-wave: the tokens after it are drawn from version 1's forward
    passes over a KV cache that version 0 computed, so they keep version 0's stamp (the oldest that
    influenced them); the next request starts a fresh wave and is stamped 1."""

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
        uniform = -torch.log(torch.tensor(float(vocab))).item()
        # the swap did happen mid-wave: the last tokens came from version 1's weights ...
        assert all(abs(lp - uniform) < 1e-5 for lp in r.logprobs[swap_at:])
        assert all(abs(lp - uniform) > 1e-3 for lp in r.logprobs[:swap_at])
        # ... yet they are stamped with version 0, whose KV cache they attended to
        assert r.versions == [0] * 10
        assert engine.version == 1
        r = await engine.generate([1, 7, 8], SamplingParams(max_tokens=4))
        assert r.versions == [1] * 4 and all(abs(lp - uniform) < 1e-5 for lp in r.logprobs)
        await engine.close()

    asyncio.run(main())


def test_top_k_is_honoured(tiny_checkpoint: Path) -> None:
    async def main() -> None:
        engine = TorchEngine("p", str(tiny_checkpoint), seed=5)
        prompt = [1, 9, 4]
        r = await engine.generate(prompt, SamplingParams(temperature=1.3, top_k=3, max_tokens=16))
        with torch.no_grad():
            logits = engine.model(torch.tensor([prompt + r.tokens])).logits[0, len(prompt) - 1 : -1]
        top3 = logits.topk(3, dim=-1).indices
        assert all(t in top3[i].tolist() for i, t in enumerate(r.tokens))
        ref = teacher_forced(engine, prompt, r.tokens, 1.3, 1.0, 3)
        assert (ref - torch.tensor(r.logprobs)).abs().max().item() <= 1e-5
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
            await engine.update_weights(
                {"model.norm.weight": torch.zeros_like(before["model.norm.weight"])}, 5
            )
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


def test_a_seeded_request_draws_the_same_tokens_in_any_batch(tiny_checkpoint: Path) -> None:
    """SamplingParams.seed: the draws depend on the seed alone, not on the batch the request shares,
    the engine's own stream or another engine; log-probs stay exact."""
    prompt = [1, 5, 6, 7]
    seeded = SamplingParams(temperature=1.0, max_tokens=12, seed=42)

    async def alone(engine_seed: int) -> list[int]:
        engine = TorchEngine("p", str(tiny_checkpoint), seed=engine_seed)
        r = await engine.generate(prompt, seeded)
        await engine.close()
        return r.tokens

    async def in_a_batch() -> tuple[list[int], list[list[int]]]:
        engine = TorchEngine("p", str(tiny_checkpoint), seed=9)
        others = [
            engine.generate([1, 8 + i, 9], SamplingParams(temperature=1.0, max_tokens=12)) for i in range(5)
        ]
        results = await asyncio.gather(*others[:3], engine.generate(prompt, seeded), *others[3:])
        ref = teacher_forced(engine, prompt, results[3].tokens, 1.0, 1.0)
        assert (ref - torch.tensor(results[3].logprobs)).abs().max().item() <= 1e-4
        await engine.close()
        return results[3].tokens, [r.tokens for r in results]

    first, second = asyncio.run(alone(0)), asyncio.run(alone(123))
    batched, all_rows = asyncio.run(in_a_batch())
    assert first == second == batched and len(first) == 12
    assert len({tuple(t) for t in all_rows}) > 1  # the unseeded rows drew their own tokens


def test_requests_with_one_prompt_share_its_prefill(tiny_checkpoint: Path) -> None:
    """A group's episodes send one prompt: it is prefilled once for all of them, each row still
    draws its own tokens, seeded rows the tokens they draw alone, and every log-prob is exact."""
    group, other = [1, 5, 6, 7, 8], [1, 9, 10]
    seeded = SamplingParams(temperature=1.0, max_tokens=10, seed=7)

    async def alone() -> list[int]:
        engine = TorchEngine("p", str(tiny_checkpoint), seed=0)
        r = await engine.generate(group, seeded)
        await engine.close()
        return r.tokens

    async def together() -> list[list[int]]:
        engine = TorchEngine("p", str(tiny_checkpoint), seed=2, max_batch=64)
        params = SamplingParams(temperature=1.0, max_tokens=10)
        asks = [engine.generate(group, params) for _ in range(6)] + [engine.generate(other, params)]
        results = await asyncio.gather(*asks, engine.generate(group, seeded))
        assert engine.prefilled < 8  # at least two rows shared a prefill
        for prompt, r in zip([group] * 6 + [other, group], results, strict=True):
            ref = teacher_forced(engine, prompt, r.tokens, 1.0, 1.0)
            assert (ref - torch.tensor(r.logprobs)).abs().max().item() <= 1e-4
        await engine.close()
        return [r.tokens for r in results]

    drawn = asyncio.run(together())
    assert len({tuple(t) for t in drawn[:6]}) > 1  # the copies sample on their own
    assert drawn[-1] == asyncio.run(alone())


def test_a_prefill_runs_each_distinct_prompt_once(tiny_checkpoint: Path) -> None:
    group, other = [1, 5, 6, 7, 8], [1, 9, 10]
    engine = TorchEngine("p", str(tiny_checkpoint), seed=0)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        params = SamplingParams(temperature=1.0, max_tokens=4)
        prompts = [group, other, group, group, other]
        batch = [Request(p, params, loop, loop.create_future()) for p in prompts]
        with torch.inference_mode():
            rows = engine._prefill(batch)  # the engine thread is idle: nothing is pending
        assert rows is not None and engine.prefilled == 2 and engine.forwards == 1
        assert rows.cache.layers[0].keys.shape[0] == len(prompts) == rows.logits.shape[0]
        for i, prompt in enumerate(prompts):
            with torch.no_grad():
                ref = engine.model(torch.tensor([prompt])).logits[0, -1]
            torch.testing.assert_close(rows.logits[i], ref, rtol=1e-5, atol=1e-5)
            first = prompts.index(prompt)
            assert torch.equal(rows.cache.layers[0].keys[i], rows.cache.layers[0].keys[first])
        await engine.close()

    asyncio.run(main())
