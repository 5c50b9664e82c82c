"""Contract test of the `sglang` engine against an in-test HTTP server that implements SGLang's
documented native API shapes (no GPU here, so no real server): `/generate` with input_ids and
log-probs, `/update_weights_from_disk`, `/pause_generation` and `/continue_generation`.

The fake server checks the requests the way SGLang's request models would (unknown or missing fields
are 400) and answers with the documented response shapes, so a drift in either side fails here. Its
log-probs follow SGLang's sampler (`srt/layers/sampler.py`): log softmax(logits / temperature) of a
fixed logits table, top-p/top-k not applied to them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp import web

from astraflow.errors import ConfigError
from astraflow.sampling import sampling_logprobs
from tests.workers.conftest import make_recipe
from workers.engines.base import SamplingParams
from workers.engines.sglang_engine import SGLangEngine, SGLangError, parse_generate

SAMPLING_KEYS = {
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "skip_special_tokens",
    "no_stop_trim",
    "ignore_eos",
    "n",
    "frequency_penalty",
}
GENERATE_KEYS = {
    "text",
    "input_ids",
    "sampling_params",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "stream",
    "rid",
}
UPDATE_KEYS = {
    "model_path",
    "load_format",
    "abort_all_requests",
    "weight_version",
    "is_async",
    "torch_empty_cache",
    "keep_pause",
    "recapture_cuda_graph",
    "token_step",
    "flush_cache",
}


class FakeSGLang:
    def __init__(self, vocab: int = 50, pause: bool = True) -> None:
        self.vocab = vocab
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.weight_version = "default"
        self.paused = False
        self.app = web.Application()
        self.app.router.add_post("/generate", self.generate)
        self.app.router.add_post("/update_weights_from_disk", self.update)
        if pause:
            self.app.router.add_post("/pause_generation", self.pause)
            self.app.router.add_post("/continue_generation", self.resume)

    async def _body(self, request: web.Request, allowed: set[str]) -> dict[str, Any]:
        body = await request.json()
        unknown = set(body) - allowed
        if unknown:
            raise web.HTTPBadRequest(text=f"unknown fields {sorted(unknown)}")
        self.calls.append((request.path, body))
        return body

    async def generate(self, request: web.Request) -> web.Response:
        body = await self._body(request, GENERATE_KEYS)
        ids, sp = body.get("input_ids"), body.get("sampling_params", {})
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids) or set(sp) - SAMPLING_KEYS:
            raise web.HTTPBadRequest(text="input_ids must be a list of ints; sampling_params keys known")
        if self.paused:
            raise web.HTTPServiceUnavailable(text="paused")
        n, stops = sp.get("max_new_tokens", 128), set(sp.get("stop_token_ids") or [])
        out, finish = [], {"type": "length", "length": n}
        for i in range(n):
            tok = (sum(ids) + 7 * i) % self.vocab
            out.append(tok)
            if tok in stops:
                finish = {"type": "stop", "matched": tok}
                break
        temp = float(sp.get("temperature", 1.0))
        lps = [
            [float(torch.log_softmax(self.logits(ids, i) / temp, -1)[t]), t, None] for i, t in enumerate(out)
        ]
        meta = {
            "id": "r1",
            "finish_reason": finish,
            "prompt_tokens": len(ids),
            "completion_tokens": len(out),
            "cached_tokens": 0,
            "weight_version": self.weight_version,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = lps
        return web.json_response({"text": "", "output_ids": out, "meta_info": meta})

    def logits(self, ids: list[int], step: int) -> torch.Tensor:
        """The fake model's next-token logits at output position `step` of prompt `ids`."""
        return torch.randn(self.vocab, generator=torch.Generator().manual_seed(sum(ids) * 1000 + step)) * 3.0

    async def update(self, request: web.Request) -> web.Response:
        body = await self._body(request, UPDATE_KEYS)
        path = Path(body.get("model_path", ""))
        if not (path / "model.safetensors").exists() or not (path / "config.json").exists():
            return web.json_response(
                {"success": False, "message": f"cannot load {path}", "num_paused_requests": 0}, status=400
            )
        self.weight_version = body.get("weight_version") or self.weight_version
        return web.json_response(
            {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
        )

    async def pause(self, request: web.Request) -> web.Response:
        body = await self._body(request, {"mode"})
        if body.get("mode", "abort") not in ("abort", "retract", "in_place"):
            raise web.HTTPBadRequest(text="bad mode")
        self.paused = True
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def resume(self, request: web.Request) -> web.Response:
        await self._body(request, {"torch_empty_cache"})
        self.paused = False
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})


async def serve(fake: FakeSGLang) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(fake.app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    assert isinstance(site._server, asyncio.Server)  # started: a listening server
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


def test_generate_contract() -> None:
    async def main() -> None:
        fake = FakeSGLang()
        runner, url = await serve(fake)
        engine = SGLangEngine("p", url, version=3)
        r = await engine.generate([1, 2, 3], SamplingParams(temperature=0.7, max_tokens=5))
        path, body = fake.calls[-1]
        assert path == "/generate" and body["input_ids"] == [1, 2, 3] and body["return_logprob"] is True
        assert (
            body["sampling_params"]["max_new_tokens"] == 5 and body["sampling_params"]["temperature"] == 0.7
        )
        assert body["sampling_params"]["top_p"] == 1.0
        assert len(r.tokens) == 5 and r.finish_reason == "length" and r.versions == [3] * 5
        assert r.logprobs[1] < -0.01 and len(set(r.logprobs)) == 5  # read back per token, not a constant
        stop_tok = (6 + 7) % 50  # the second token the fake emits for this prompt
        r = await engine.generate([1, 2, 3], SamplingParams(max_tokens=5, stop_token_ids=(stop_tok,)))
        assert r.finish_reason == "stop" and r.tokens[-1] == stop_tok and len(r.tokens) == 2
        await engine.close()
        await runner.cleanup()

    asyncio.run(main())


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_logprobs_read_back_are_the_trainers(temperature: float) -> None:
    """With top_p 1 and top_k 0, SGLang's log-probs are those of the trainer's distribution
    (astraflow.sampling at the same temperature), token by token."""

    async def main() -> None:
        fake = FakeSGLang()
        runner, url = await serve(fake)
        engine = SGLangEngine("p", url)
        prompt = [1, 4, 9]
        r = await engine.generate(prompt, SamplingParams(temperature=temperature, max_tokens=6))
        trainer = [
            float(sampling_logprobs(fake.logits(prompt, i), temperature)[t]) for i, t in enumerate(r.tokens)
        ]
        assert r.logprobs == pytest.approx(trainer, abs=1e-6)
        untempered = [float(torch.log_softmax(fake.logits(prompt, i), -1)[t]) for i, t in enumerate(r.tokens)]
        if temperature != 1.0:  # the temperature matters: the raw log-probs would not pass the check above
            assert max(abs(a - b) for a, b in zip(r.logprobs, untempered, strict=True)) > 1e-3
        await engine.close()
        await runner.cleanup()

    asyncio.run(main())


def test_truncated_sampling_is_refused() -> None:
    """SGLang's log-probs ignore top-p/top-k, which the trainer's distribution applies: the engine
    refuses such requests (before any HTTP call) and a recipe naming the sglang engine refuses them."""
    logits = FakeSGLang().logits([1, 2], 0)
    tok = int(logits.argmax())
    assert float(sampling_logprobs(logits, 1.0, 0.9)[tok]) > float(torch.log_softmax(logits, -1)[tok]) + 1e-3

    async def main() -> None:
        fake = FakeSGLang()
        runner, url = await serve(fake)
        engine = SGLangEngine("p", url)
        for params in (SamplingParams(top_p=0.9), SamplingParams(top_k=5)):
            with pytest.raises(SGLangError, match="top_p"):
                await engine.generate([1, 2], params)
        with pytest.raises(SGLangError, match="per-request seed"):  # common randomness: torch engine only
            await engine.generate([1, 2], SamplingParams(seed=7))
        assert fake.calls == []
        await engine.close()
        await runner.cleanup()

    asyncio.run(main())
    for sampling in ({"top_p": 0.9}, {"top_k": 5}):
        with pytest.raises(ConfigError, match="sglang engine returns log-probs without"):
            make_recipe(worker={"engine": {"type": "sglang"}, **sampling})
    make_recipe(
        worker={"engine": {"type": "torch"}, "top_p": 0.9, "top_k": 5}
    )  # the torch engine renormalises


def test_weight_update_contract(tiny_checkpoint: Path) -> None:
    async def main() -> None:
        fake = FakeSGLang()
        runner, url = await serve(fake)
        engine = SGLangEngine("p", url, model_path=str(tiny_checkpoint))
        from safetensors.torch import load_file

        state = load_file(str(tiny_checkpoint / "model.safetensors"))
        await engine.update_weights(state, 4)
        paths = [p for p, _ in fake.calls]
        assert paths == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"]
        body = fake.calls[1][1]
        assert body["weight_version"] == "4" and body["flush_cache"] is True
        assert torch.equal(
            load_file(str(Path(body["model_path"]) / "model.safetensors"))["model.norm.weight"],
            state["model.norm.weight"],
        )
        assert engine.version == 4 and not fake.paused
        r = await engine.generate([5], SamplingParams(max_tokens=2))
        assert r.versions == [4, 4]
        await engine.close()
        await runner.cleanup()

    asyncio.run(main())


def test_refused_update_keeps_version_and_servers_without_pause() -> None:
    async def main() -> None:
        fake = FakeSGLang(pause=False)
        runner, url = await serve(fake)
        engine = SGLangEngine("p", url, version=1)
        with pytest.raises(SGLangError, match="refused version 2"):
            await engine.update_weights({}, 2, source="/nonexistent")
        assert engine.version == 1 and engine.pause is False  # 404 on pause turns it off
        assert [p for p, _ in fake.calls] == ["/update_weights_from_disk"]
        await engine.close()
        await runner.cleanup()

    asyncio.run(main())


def test_malformed_answers_are_named() -> None:
    with pytest.raises(SGLangError, match="meta_info"):
        parse_generate({"text": ""})
    with pytest.raises(SGLangError, match="output_token_logprobs"):
        parse_generate({"meta_info": {}})
    with pytest.raises(SGLangError, match="disagree"):
        parse_generate({"output_ids": [1], "meta_info": {"output_token_logprobs": [[-1.0, 2, None]]}})
    r = parse_generate(
        {"meta_info": {"output_token_logprobs": [[-1.0, 2, None]], "finish_reason": {"type": "abort"}}}
    )
    assert r.finish_reason == "aborted" and r.tokens == [2]
