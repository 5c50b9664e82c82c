"""What an environment is: a task generator plus an interaction with a verifiable reward.

The feeder calls `tasks(seed)` to make Tasks; a worker's workflow calls `reset(task)` for the first
observation and `step(state, action_tokens)` after each model turn. Observations are text that the
workflow encodes and appends as tokens; actions arrive as the model's own token ids, which an
environment may read as text (`Codec.text`) but which are never re-tokenised into the trajectory.
Rewards are scored from token ids (`Codec.ids`), so `7<pad>` never counts as `7`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from astraflow.config import StrictModel, validate_model
from astraflow.records import Task


@dataclass
class TaskSpec:
    """One task as a generator makes it; the feeder turns it into a Task record."""

    key: str  # stable name of the problem, part of the deterministic task_id
    prompt: str | None = None
    seed: int | None = None
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass
class Step:
    """The environment's answer to one model turn."""

    observation: str | None = None  # text to append before the next turn (None when done)
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Codec:
    """Token ids <-> text for environments, with special tokens kept visible."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.bos = int(tokenizer.bos_token_id)
        self.eos = int(tokenizer.eos_token_id)
        self.pad = int(tokenizer.pad_token_id)
        self._cache: dict[str, list[int]] = {}

    def ids(self, text: str) -> list[int]:
        """Token ids of `text` (no special tokens added). Characters outside the vocabulary are an
        error: an environment must never feed `<unk>` to the model silently."""
        hit = self._cache.get(text)
        if hit is None:
            hit = list(self.tokenizer.encode(text, add_special_tokens=False))
            unk = self.tokenizer.unk_token_id
            if unk is not None and unk in hit:
                bad = sorted({c for c in text if self.tokenizer.encode(c, add_special_tokens=False) == [unk]})
                raise ValueError(f"characters {bad} are not in the tokenizer's vocabulary")
            if len(self._cache) < 4096:
                self._cache[text] = hit
        return list(hit)

    def text(self, tokens: Sequence[int], stop_at_eos: bool = True) -> str:
        """Text of model tokens; stops at <eos>; other special tokens stay visible (`<pad>`)."""
        toks = list(tokens)
        if stop_at_eos and self.eos in toks:
            toks = toks[: toks.index(self.eos)]
        return str(self.tokenizer.decode(toks, skip_special_tokens=False, clean_up_tokenization_spaces=False))


def load_tokenizer(path: str | Path) -> Any:
    """The checkpoint's tokenizer exactly as its tokenizer.json defines it. (For the project's own
    tokenizer AutoTokenizer gives the same ids, see astraflow.models.build_tokenizer; this also
    holds for real checkpoints whose tokenizer.json transformers would otherwise rebuild.)"""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(path))


class Environment:
    """Base of every environment. Subclasses set `name`, `Args`, and implement the methods."""

    name: ClassVar[str] = ""
    #: workflow that runs this environment unless the recipe names another
    default_workflow: ClassVar[str] = "agent"

    class Args(StrictModel):
        """No arguments."""

    def __init__(self, **args: Any) -> None:
        self.args = validate_model(self.Args, args, f"arguments of environment {self.name!r}")

    def tasks(self, seed: int) -> Iterator[tuple[TaskSpec, int]]:
        """Endless deterministic stream of (task, attempt): the same seed yields the same stream."""
        raise NotImplementedError

    def reset(self, task: Task, codec: Codec, rng: random.Random) -> tuple[Any, str]:
        """Start an episode: (state, first observation text)."""
        raise NotImplementedError

    async def step(self, state: Any, action: list[int], codec: Codec) -> Step:
        """Score or answer one model turn (its token ids, stop token included)."""
        raise NotImplementedError

    def expert(self, state: Any) -> str:
        """The next action of a scripted expert in this episode (text, stop character included), for
        the demonstrations of a supervised warm-up (`trainer.warmup`, workers/demonstrations.py).
        Optional: an environment without one cannot be warmed up on."""
        raise NotImplementedError

    def turn_params(self, state: Any, codec: Codec) -> dict[str, Any]:
        """Sampling limits of the next model turn: max_tokens and stop_token_ids."""
        return {"max_tokens": 16, "stop_token_ids": (codec.eos,)}

    async def close(self) -> None:
        """Release resources (indexes, sandboxes)."""


def cycle_pool(pool: Sequence[TaskSpec], seed: int) -> Iterator[tuple[TaskSpec, int]]:
    """Visit a finite pool of problems in a fresh seeded order each epoch; the epoch is the attempt,
    so task statistics accumulate per problem and group ids stay unique."""
    epoch = 0
    while True:
        order = list(range(len(pool)))
        random.Random(f"{seed}:{epoch}").shuffle(order)
        for i in order:
            yield pool[i], epoch
        epoch += 1
