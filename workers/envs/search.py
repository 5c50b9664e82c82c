"""`search`: tool use against a local BM25 index over a corpus the environment generates.

Each task's corpus comes from `payload.corpus_seed`: made-up entities with attributes, one short
document per fact (`zorb color red`). The prompt asks for one fact (`color of zorb?\n`). Each turn the
model writes one line: `s <query>` runs a search (after `tool_latency_s`, the simulated cost of a real
tool) and the top documents come back as the next observation; `a <answer>` ends the episode.
Reward 1 for the right answer, else 0.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from pydantic import Field

from astraflow.config import StrictModel
from astraflow.records import Task
from workers.envs.base import Codec, Environment, Step, TaskSpec, cycle_pool
from workers.envs.bm25 import BM25

SYLLABLES = ("ka", "zo", "ri", "mu", "te", "lo", "pi", "na", "ve", "du", "xo", "fe")
ATTRIBUTES = {
    "color": ("red", "blue", "green", "black", "white", "gold"),
    "home": ("oslo", "lima", "rome", "kyiv", "pune", "nice"),
    "pet": ("cat", "dog", "owl", "fox", "yak", "emu"),
}


@lru_cache(maxsize=64)
def make_corpus(
    corpus_seed: int, n_entities: int
) -> tuple[tuple[str, ...], tuple[tuple[str, str, str], ...]]:
    """Deterministic corpus: (documents, facts as (entity, attribute, value))."""
    rng = random.Random(corpus_seed)
    names: list[str] = []
    while len(names) < n_entities:
        name = "".join(rng.choice(SYLLABLES) for _ in range(2))
        if name not in names:
            names.append(name)
    facts = [(e, a, rng.choice(vals)) for e in names for a, vals in ATTRIBUTES.items()]
    return tuple(f"{e} {a} {v}" for e, a, v in facts), tuple(facts)


@lru_cache(maxsize=64)
def index_for(corpus_seed: int, n_entities: int) -> BM25:
    return BM25(make_corpus(corpus_seed, n_entities)[0])


class SearchEnv(Environment):
    name = "search"

    class Args(StrictModel):
        """Arguments of `search`."""

        n_entities: int = Field(default=8, ge=1, le=200)
        """Entities in each generated corpus (three documents each)."""
        n_corpora: int = Field(default=4, ge=1, le=1000)
        """Distinct corpora the generator draws tasks from."""
        top_k: int = Field(default=2, ge=1, le=20)
        """Documents returned by one search."""
        max_turns: int = Field(default=3, ge=1, le=32)
        """Model turns (searches plus the answer)."""
        max_line_tokens: int = Field(default=24, ge=2, le=512)
        """Longest line the model may write in one turn."""
        tool_latency_s: float = Field(default=0.0, ge=0.0, le=60.0)
        """Simulated latency of one search call."""

    def tasks(self, seed: int) -> Iterator[tuple[TaskSpec, int]]:
        pool = []
        for c in range(self.args.n_corpora):
            corpus_seed = seed * 1000 + c
            for entity, attr, value in make_corpus(corpus_seed, self.args.n_entities)[1]:
                pool.append(
                    TaskSpec(
                        key=f"{corpus_seed}-{entity}-{attr}",
                        prompt=f"{attr} of {entity}?\n",
                        payload={
                            "corpus_seed": corpus_seed,
                            "n_entities": self.args.n_entities,
                            "answer": value,
                        },
                    )
                )
        return cycle_pool(pool, seed)

    def reset(self, task: Task, codec: Codec, rng: random.Random) -> tuple[Any, str]:
        p = task.payload
        if (
            not isinstance(p.get("corpus_seed"), int)
            or not isinstance(p.get("answer"), str)
            or not task.prompt
        ):
            raise ValueError(
                "a search task needs a prompt, payload.corpus_seed (int) and payload.answer (str)"
            )
        n = int(p.get("n_entities", self.args.n_entities))
        attribute, _, entity = task.prompt.rstrip("?\n").partition(" of ")
        return {
            "entity": entity,
            "attribute": attribute,
            "index": index_for(p["corpus_seed"], n),
            "answer": p["answer"],
            "turns": 0,
            "searches": 0,
        }, task.prompt

    def expert(self, state: Any) -> str:
        """Search for the entity and the attribute asked, then answer the fact the search found."""
        if state["searches"] == 0:
            return f"s {state['entity']} {state['attribute']}\n"
        return f"a {state['found']}\n"

    def turn_params(self, state: Any, codec: Codec) -> dict[str, Any]:
        return {"max_tokens": self.args.max_line_tokens, "stop_token_ids": (codec.eos, *codec.ids("\n"))}

    async def step(self, state: Any, action: list[int], codec: Codec) -> Step:
        state["turns"] += 1
        line = codec.text(action).strip()
        last = state["turns"] >= self.args.max_turns
        if line.startswith("a "):
            ok = line[2:].strip() == state["answer"]
            return Step(reward=1.0 if ok else 0.0, done=True, info={"searches": state["searches"]})
        if line.startswith("s ") and not last:
            if self.args.tool_latency_s:
                await asyncio.sleep(self.args.tool_latency_s)
            state["searches"] += 1
            index: BM25 = state["index"]
            hits = index.search(line[2:], self.args.top_k)
            # what the expert answers from: the value of the top document's fact, if it is the one asked
            top = index.docs[hits[0][0]].split() if hits else []
            state["found"] = top[2] if top[:2] == [state["entity"], state["attribute"]] else "?"
            return Step(observation="; ".join(index.docs[i] for i, _ in hits) + "\n")
        if last:
            return Step(reward=0.0, done=True, info={"searches": state["searches"]})
        return Step(observation="?\n")
