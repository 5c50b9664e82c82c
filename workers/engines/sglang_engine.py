"""`sglang` engine: a client of an SGLang server's native HTTP API, for hosts with GPUs.

Shapes (SGLang `srt/entrypoints/http_server.py` and `srt/managers/io_struct.py`):
- `POST /generate` with `input_ids`, `sampling_params` {temperature, top_p, max_new_tokens,
  stop_token_ids, skip_special_tokens, no_stop_trim}, `return_logprob: true`, `logprob_start_len: -1`;
  answers `{text, output_ids, meta_info: {finish_reason: {type: stop|length|abort, ...},
  output_token_logprobs: [[logprob, token_id, text|null], ...], weight_version?, ...}}`.
- `POST /update_weights_from_disk` {model_path, weight_version, flush_cache, abort_all_requests};
  answers `{success, message, num_paused_requests}` (400 when it fails).
- `POST /pause_generation` {mode: in_place} and `POST /continue_generation` {} around an update,
  when the server offers them (a 404 turns the feature off for this client).

Log-probs: SGLang's `output_token_logprobs` are log softmax(logits / temperature) of the sampling
step (`srt/layers/sampler.py`; top-p and top-k are applied when drawing, not to the returned
log-probs: their renormalisation there is commented out over a flashinfer numerical issue). That is
`astraflow.sampling.sampling_logprobs`, the trainer's distribution, only with top_p 1 and top_k 0, so
this engine refuses requests with either (and a recipe naming the sglang engine refuses them at load).
Two server settings would break the agreement silently and must stay off: the environment variable
SGLANG_RETURN_ORIGINAL_LOGPROB (log-probs before temperature) and penalties or logit biases (not sent).
Greedy requests (temperature 0) get log softmax(logits), which no recipe trains on.

Versions: SGLang reports no per-token weight version, so every token of a request is stamped with the
version the client knew when the request was sent, unless an update completed while it ran, in which
case the older one is kept: staleness is over- rather than under-estimated.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astraflow.errors import AstraFlowError
from workers.engines.base import GenResult, SamplingParams

if TYPE_CHECKING:
    import aiohttp
    import torch

log = logging.getLogger(__name__)
FINISH = {"stop": "stop", "length": "length", "abort": "aborted"}


class SGLangError(AstraFlowError):
    """The SGLang server refused a request or answered in an unexpected shape."""


class SGLangEngine:
    def __init__(
        self,
        policy: str,
        url: str,
        *,
        model_path: str | None = None,
        timeout_s: float = 600.0,
        pause: bool = True,
        flush_cache: bool = True,
        version: int = 0,
    ) -> None:
        self.policy = policy
        self.url = url.rstrip("/")
        self.model_path = model_path
        self.timeout_s = timeout_s
        self.pause = pause
        self.flush_cache = flush_cache
        self._version = version
        self._session: aiohttp.ClientSession | None = None
        self._update_lock = asyncio.Lock()
        self._tmp: Path | None = None
        self.tokens_generated = 0

    @property
    def version(self) -> int:
        return self._version

    async def _http(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._session

    async def _post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        session = await self._http()
        async with session.post(self.url + path, json=body) as resp:
            text = await resp.text()
            try:
                data = json.loads(text) if text else None
            except ValueError:
                data = text
            return resp.status, data

    async def generate(self, prompt: Sequence[int], params: SamplingParams) -> GenResult:
        if params.top_p < 1.0 or params.top_k > 0:
            raise SGLangError(
                f"the sglang engine cannot sample with top_p {params.top_p} / top_k {params.top_k}: "
                "SGLang returns log-probs without their renormalisation (see the module docstring)"
            )
        if params.seed is not None:
            raise SGLangError(
                "the sglang engine cannot sample with a per-request seed shared by several requests "
                "(common randomness, e.g. referential_game's shared_randomness): use the torch engine"
            )
        body = {
            "input_ids": [int(t) for t in prompt],
            "sampling_params": {
                "temperature": params.temperature,
                "top_p": params.top_p,
                "max_new_tokens": params.max_tokens,
                "stop_token_ids": list(params.stop_token_ids),
                "skip_special_tokens": False,
                "no_stop_trim": True,
            },
            "return_logprob": True,
            "logprob_start_len": -1,
        }
        version = self._version
        status, data = await self._post("/generate", body)
        if status != 200 or not isinstance(data, dict):
            raise SGLangError(f"{self.url}/generate answered {status}: {str(data)[:300]}")
        result = parse_generate(data)
        result.versions = [min(version, self._version)] * len(result.tokens)
        self.tokens_generated += len(result.tokens)
        return result

    async def update_weights(
        self, state: Mapping[str, torch.Tensor], version: int, source: str | None = None
    ) -> None:
        async with self._update_lock:
            path = source or await asyncio.to_thread(self._save, state, version)
            paused = False
            if self.pause:
                status, _ = await self._post("/pause_generation", {"mode": "in_place"})
                if status == 404:
                    self.pause = False
                    log.info("%s offers no /pause_generation; updating without pausing", self.url)
                paused = status == 200
            try:
                status, data = await self._post(
                    "/update_weights_from_disk",
                    {
                        "model_path": str(path),
                        "weight_version": str(version),
                        "flush_cache": self.flush_cache,
                        "abort_all_requests": False,
                    },
                )
            finally:
                if paused:
                    await self._post("/continue_generation", {})
            ok = status == 200 and isinstance(data, dict) and data.get("success", True)
            if not ok:
                raise SGLangError(f"{self.url}/update_weights_from_disk refused version {version}: {data}")
            self._version = version

    def _save(self, state: Mapping[str, torch.Tensor], version: int) -> Path:
        """Write `state` as a transformers checkpoint the server can load (config from the initial one)."""
        from safetensors.torch import save_file

        if self.model_path is None:
            raise SGLangError("the sglang engine needs model_path to turn weights into a checkpoint")
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix=f"astraflow-sglang-{self.policy}-"))
        out = self._tmp / f"v{version}"
        out.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "generation_config.json"):
            if (Path(self.model_path) / name).exists():
                shutil.copy(Path(self.model_path) / name, out / name)
        unique: dict[str, Any] = {}
        seen: set[int] = set()
        for name, t in state.items():  # tied tensors are stored once
            if id(t) not in seen:
                seen.add(id(t))
                unique[name] = t.contiguous()
        save_file(unique, str(out / "model.safetensors"))
        for old in self._tmp.iterdir():  # keep the previous version only while the new one loads
            if old != out and old.name != f"v{version - 1}":
                shutil.rmtree(old, ignore_errors=True)
        return out

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


def parse_generate(data: dict[str, Any]) -> GenResult:
    """A GenResult from a /generate answer; raises SGLangError naming what is missing."""
    meta = data.get("meta_info")
    if not isinstance(meta, dict):
        raise SGLangError("/generate answer has no meta_info")
    entries = meta.get("output_token_logprobs")
    if not isinstance(entries, list):
        raise SGLangError(
            "/generate answer has no meta_info.output_token_logprobs (was return_logprob sent?)"
        )
    tokens, logprobs = [], []
    for i, e in enumerate(entries):
        if not isinstance(e, (list, tuple)) or len(e) < 2:
            raise SGLangError(f"meta_info.output_token_logprobs[{i}] is not [logprob, token_id, ...]")
        logprobs.append(min(0.0, float(e[0])) if e[0] is not None else 0.0)
        tokens.append(int(e[1]))
    ids = data.get("output_ids")
    if isinstance(ids, list) and ids and [int(t) for t in ids] != tokens:
        raise SGLangError("output_ids and output_token_logprobs disagree")
    reason = meta.get("finish_reason")
    kind = reason.get("type") if isinstance(reason, dict) else reason
    return GenResult(
        tokens=tokens, logprobs=logprobs, versions=[], finish_reason=FINISH.get(str(kind), "length")
    )
