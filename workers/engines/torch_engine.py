"""`torch` engine: a local transformers model behind a batching KV-cache sampling loop.

Episodes (asyncio tasks of the worker) submit requests; one engine thread gathers whatever is
pending into a batch (a "wave"), prefills it left-padded (each distinct prompt once: a group's
episodes share theirs), then decodes all rows together, dropping rows from the KV cache as they
finish. A request that arrives while a wave decodes joins it at the
next decode step: it is prefilled on its own and its KV cache merged into the wave's (both
left-padded to one length), so an episode never waits for a wave to end. Every token records the
log-prob of the distribution it was drawn from (temperature, top-p and top-k applied:
`astraflow/sampling.py`, the function the trainer uses too). CPU or CUDA, float32 or bfloat16
(log-probs are computed in float32). The requests and a wave's rows: workers/engines/waves.py.

Versions under in-flight updates: between two decode steps the engine applies pending weight
updates, but it keeps the wave's KV cache, which earlier weights computed. A token is therefore
stamped with the *oldest* version that influenced it: the minimum over the versions of every forward
pass of its row so far (its prefill included), not the version of the last pass. After a swap the rest
of a running wave keeps the old stamp; the next wave starts clean on the new version. This is cheap
(no re-prefill) and honest: staleness is never under-counted, so `max_staleness: 0` drops the samples
holding such tokens instead of training on a behaviour distribution that no single version
defines. Re-prefilling on a swap would keep those tokens but cost a full prefill of every
running row per update.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from astraflow.errors import AstraFlowError
from astraflow.sampling import sampling_logprobs
from workers.engines.base import GenResult, SamplingParams
from workers.engines.sampling import sample, sample_seeded, seeded_noise
from workers.engines.waves import Request, Rows, hand_back, resolve

log = logging.getLogger(__name__)


class WeightLoadError(AstraFlowError):
    """A weight update does not fit the engine's model (names or shapes)."""


class TorchEngine:
    """Serves one policy from a local checkpoint directory (transformers layout)."""

    def __init__(
        self,
        policy: str,
        model_path: str,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch: int = 64,
        seed: int = 0,
        version: int = 0,
        attn_implementation: str = "sdpa",
        batch_wait_s: float = 0.002,
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.policy = policy
        self.device = torch.device(device)
        self.model = (
            AutoModelForCausalLM.from_pretrained(
                model_path, dtype=getattr(torch, dtype), attn_implementation=attn_implementation
            )
            .to(self.device)
            .eval()
        )
        cfg = self.model.config
        self.max_positions = int(cfg.max_position_embeddings)
        self.pad_id = int(cfg.pad_token_id if cfg.pad_token_id is not None else 0)
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self._version = version
        self._pending: deque[Request] = deque()
        self._updates: deque[
            tuple[Mapping[str, torch.Tensor], int, Callable[[BaseException | None], None]]
        ] = deque()
        self._cv = threading.Condition()
        self._closed = False
        #: called in the engine thread before every forward pass with the number of passes so far
        self.step_hook: Callable[[int], None] | None = None
        self.forwards = 0
        self.tokens_generated = 0
        #: prompts prefilled: one per distinct prompt of a prefill (requests sharing it share its prefill)
        self.prefilled = 0
        self._thread = threading.Thread(target=self._run, name=f"torch-engine-{policy}", daemon=True)
        self._thread.start()

    @property
    def version(self) -> int:
        return self._version

    # ------------------------------------------------------------------ API (event-loop side)

    async def generate(self, prompt: Sequence[int], params: SamplingParams) -> GenResult:
        if not prompt:
            raise ValueError("a generation request needs at least one prompt token")
        loop = asyncio.get_running_loop()
        req = Request([int(t) for t in prompt], params, loop, loop.create_future())
        with self._cv:
            if self._closed:
                raise AstraFlowError(f"engine of {self.policy} is closed")
            self._pending.append(req)
            self._cv.notify()
        try:
            return await req.future
        except asyncio.CancelledError:
            req.cancelled = True  # the engine thread drops the row at its next step
            raise

    async def update_weights(
        self, state: Mapping[str, torch.Tensor], version: int, source: str | None = None
    ) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def done(exc: BaseException | None) -> None:
            loop.call_soon_threadsafe(resolve, fut, None, exc)

        self.queue_update(state, version, done)
        await fut

    def queue_update(
        self,
        state: Mapping[str, torch.Tensor],
        version: int,
        done: Callable[[BaseException | None], None] | None = None,
    ) -> None:
        """Thread-safe: load `state` as `version` before the next forward pass."""
        with self._cv:
            self._updates.append((state, version, done or (lambda exc: None)))
            self._cv.notify()

    async def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        await asyncio.to_thread(self._thread.join, 30)

    # ------------------------------------------------------------------ engine thread

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._updates and not self._closed:
                    self._cv.wait()
                if self._closed:
                    break
                # Episodes resuming together (after a shared tool wait) submit within microseconds
                # of each other: a short window lets them share one wave instead of queueing behind
                # a wave of one.
                if self._pending and self.batch_wait_s > 0 and len(self._pending) < self.max_batch:
                    self._cv.wait(self.batch_wait_s)
                batch: list[Request] = []
                while self._pending and len(batch) < self.max_batch:
                    req = self._pending.popleft()
                    if not req.cancelled:
                        batch.append(req)
            self._apply_updates()
            if batch:
                try:
                    self._wave(batch)
                except Exception as exc:  # a bug or an OOM fails this wave's requests, not the worker
                    log.exception("engine %s: wave of %d requests failed", self.policy, len(batch))
                    for req in batch:
                        req.loop.call_soon_threadsafe(resolve, req.future, None, exc)
        with self._cv:
            leftover = list(self._pending)
            self._pending.clear()
        for req in leftover:
            req.result.finish_reason = "aborted"
        hand_back(leftover)

    def _apply_updates(self) -> None:
        while True:
            with self._cv:
                if not self._updates:
                    return
                state, version, done = self._updates.popleft()
            try:
                self._load(state)
            except Exception as exc:
                log.error("engine %s: refused weights of version %d: %s", self.policy, version, exc)
                done(exc)
                continue
            self._version = version
            done(None)

    @torch.no_grad()
    def _load(self, state: Mapping[str, torch.Tensor]) -> None:
        # state_dict(keep_vars=True) names tied tensors under every alias (lm_head.weight too)
        params = self.model.state_dict(keep_vars=True)
        unknown = sorted(set(state) - set(params))
        if unknown:
            raise WeightLoadError(f"unknown tensors {unknown[:3]} for this model")
        optional = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()
        optional |= {n for n, _ in self.model.named_buffers()}
        missing = sorted(set(params) - set(state) - optional)
        if missing:
            raise WeightLoadError(f"missing tensors {missing[:3]}")
        for name, tensor in state.items():
            if tuple(tensor.shape) != tuple(params[name].shape):
                raise WeightLoadError(f"{name}: shape {tuple(tensor.shape)} != {tuple(params[name].shape)}")
        for name, tensor in state.items():
            params[name].data.copy_(tensor)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        if self.step_hook is not None:
            self.step_hook(self.forwards)
        self._apply_updates()
        self.forwards += 1
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True
        )
        return out.logits[:, -1, :]

    def _take_pending(self, room: int) -> list[Request]:
        """Requests waiting for the engine, at most `room` of them (in-flight joining)."""
        out: list[Request] = []
        if room <= 0 or not self._pending:
            return out
        with self._cv:
            while self._pending and len(out) < room:
                req = self._pending.popleft()
                if not req.cancelled:
                    out.append(req)
        return out

    def _prefill(self, batch: list[Request]) -> Rows | None:
        """Prefill `batch` (left-padded) into a fresh KV cache; None if no request has room left."""
        from transformers import DynamicCache

        rows: list[Request] = []
        budget: list[int] = []
        full: list[Request] = []
        for req in batch:
            room = min(req.params.max_tokens, self.max_positions - len(req.prompt))
            if room <= 0:  # the context is already full: nothing can be generated
                full.append(req)
                continue
            rows.append(req)
            budget.append(room)
        hand_back(full)
        if not rows:
            return None
        dev = self.device
        # Requests with one prompt (a group's episodes) share its prefill: each distinct prompt
        # runs once and its KV cache and next-token logits are copied to every row that has it.
        # The arithmetic recipe's waves prefilled 64 rows of 8 prompts.
        distinct: dict[tuple[int, ...], int] = {}
        slot = [distinct.setdefault(tuple(r.prompt), len(distinct)) for r in rows]
        width = max(len(p) for p in distinct)
        ids = torch.full((len(distinct), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(distinct), width), dtype=torch.long)
        for i, prompt in enumerate(distinct):
            ids[i, width - len(prompt) :] = torch.tensor(prompt)
            mask[i, width - len(prompt) :] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        logits = self._forward(ids, mask, pos, cache)
        self.prefilled += len(distinct)
        if len(distinct) < len(rows):
            index = torch.tensor(slot, device=dev)
            cache.batch_select_indices(index)
            mask, pos, logits = mask[index], pos[index], logits[index]
        return Rows(
            rows,
            budget,
            [self._version] * len(rows),
            cache,
            mask,
            pos[:, -1],
            logits,
            torch.tensor([r.params.temperature for r in rows], device=dev),
            torch.tensor([r.params.top_p for r in rows], device=dev),
            torch.tensor([r.params.top_k for r in rows], device=dev),
        )

    @torch.inference_mode()
    def _wave(self, batch: list[Request]) -> None:
        """Decode `batch` together until every row has finished. Requests that arrive meanwhile
        join at the next decode step (prefilled on their own, their KV cache merged in), so an
        episode never waits for a whole wave to end."""
        wave = self._prefill(batch)
        while wave is not None:
            logp = sampling_logprobs(wave.logits, wave.temps, wave.tops, wave.topks)
            tokens, lps = sample(logp, self.generator)
            tok_list, lp_list = tokens.tolist(), lps.tolist()
            for i, r in enumerate(wave.rows):
                if r.params.seed is not None:  # its own random numbers, whatever batch it is in
                    noise = seeded_noise(r.params.seed, len(r.result.tokens), logp.shape[-1])
                    tok_list[i], lp_list[i] = sample_seeded(logp[i], noise)
                    tokens[i] = tok_list[i]
            keep: list[int] = []
            finished: list[Request] = []
            for i, r in enumerate(wave.rows):
                res = r.result
                res.tokens.append(tok_list[i])
                res.logprobs.append(lp_list[i])
                res.versions.append(wave.oldest[i])
                if r.cancelled:
                    res.finish_reason = "aborted"
                elif tok_list[i] in r.params.stop_token_ids:
                    res.finish_reason = "stop"
                elif len(res.tokens) >= wave.budget[i]:
                    res.finish_reason = "length"
                else:
                    keep.append(i)
                    continue
                finished.append(r)
            hand_back(finished)
            self.tokens_generated += len(wave.rows)
            if not keep:
                return  # the run loop starts the next wave with whatever is pending
            if len(keep) < len(wave.rows):
                wave.select(keep)
                tokens = tokens[torch.tensor(keep, device=self.device)]
            wave.mask = torch.cat([wave.mask, torch.ones_like(wave.mask[:, :1])], dim=1)
            wave.last_pos = wave.last_pos + 1
            wave.logits = self._forward(
                tokens.unsqueeze(-1), wave.mask, wave.last_pos.unsqueeze(-1), wave.cache
            )
            # the oldest version in each row's KV cache (see the module docstring)
            wave.oldest = [min(v, self._version) for v in wave.oldest]
            joining = self._prefill(self._take_pending(self.max_batch - len(wave.rows)))
            if joining is not None:
                wave.extend(joining)
