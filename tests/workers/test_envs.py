"""Environments: deterministic generators and verifiable rewards, scored from token ids."""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

import pytest

from astraflow.errors import ConfigError
from astraflow.records import Task
from workers.envs.arithmetic import ArithmeticEnv
from workers.envs.bm25 import BM25
from workers.envs.code import CodeEnv
from workers.envs.guess_number import GuessNumberEnv
from workers.envs.referential import ReferentialEnv
from workers.envs.search import SearchEnv, make_corpus
from workers.registry import environment_class, workflow_class


def task_of(env: Any, n: int = 0, seed: int = 0) -> Task:
    spec, attempt = next(itertools.islice(env.tasks(seed), n, None))
    return Task(
        task_id=spec.key,
        env=env.name,
        roles={"agent": "p"},
        prompt=spec.prompt,
        payload=spec.payload,
        attempt=attempt,
    )


def test_generators_are_deterministic_and_cycle_epochs() -> None:
    env = ArithmeticEnv()
    a = [(s.key, e) for s, e in itertools.islice(env.tasks(3), 60)]
    b = [(s.key, e) for s, e in itertools.islice(env.tasks(3), 60)]
    assert a == b
    assert len({k for k, e in a if e == 0}) == 25  # 5 x 5 sums, each once per epoch
    assert a[25][1] == 1 and [k for k, _ in a[:25]] != [k for k, _ in a[25:50]]  # re-shuffled


def test_arithmetic_scores_token_ids(codec: Any) -> None:
    env = ArithmeticEnv(max_operand=9)
    task = Task(task_id="t", env="arithmetic", roles={"agent": "p"}, prompt="7+8=", payload={"answer": "15"})
    state, obs = env.reset(task, codec, random.Random(0))
    assert obs == "7+8=" and env.turn_params(state, codec)["max_tokens"] == 2
    assert asyncio.run(env.step(state, codec.ids("15"), codec)).reward == 1.0
    assert asyncio.run(env.step(state, codec.ids("16"), codec)).reward == 0.0
    assert (
        asyncio.run(env.step(state, [*codec.ids("1"), codec.pad], codec)).reward == 0.0
    )  # `1<pad>` is not 15
    strict = ArithmeticEnv(require_eos=True)
    assert asyncio.run(strict.step(state, [*codec.ids("15"), codec.eos], codec)).reward == 1.0
    assert asyncio.run(strict.step(state, codec.ids("15"), codec)).reward == 0.0


def test_arithmetic_prefix_credit_rewards_the_right_leading_tokens(codec: Any) -> None:
    env = ArithmeticEnv(max_operand=9, require_eos=True, prefix_credit=0.3)
    task = Task(task_id="t", env="arithmetic", roles={"agent": "p"}, prompt="9+5=", payload={"answer": "14"})
    state, _ = env.reset(task, codec, random.Random(0))

    def reward(ids: list[int]) -> float:
        return asyncio.run(env.step(state, ids, codec)).reward

    eos = codec.eos
    assert reward([*codec.ids("14"), eos]) == 1.0  # exact: the full reward, never the credit
    assert reward([*codec.ids("1"), eos]) == pytest.approx(0.3 / 3)  # `1` of `1`, `4`, <eos>
    assert reward(codec.ids("14")) == pytest.approx(0.3 * 2 / 3)  # cut before <eos>
    assert reward([*codec.ids("15"), eos]) == pytest.approx(0.3 / 3)  # only a prefix counts
    assert reward([*codec.ids("4"), eos]) == 0.0 and reward([]) == 0.0
    step = asyncio.run(env.step(state, [*codec.ids("14"), eos], codec))
    assert step.info == {"correct": True}
    assert asyncio.run(env.step(state, codec.ids("14"), codec)).info == {"correct": False}
    assert ArithmeticEnv(max_operand=9, require_eos=True).correct(state, codec.ids("14"), codec) is False
    with pytest.raises(ConfigError, match="prefix_credit"):
        ArithmeticEnv(prefix_credit=1.0)  # a wrong answer must earn less than a right one


def test_unknown_env_argument_names_the_key() -> None:
    with pytest.raises(ConfigError, match="max_operandd"):
        ArithmeticEnv(max_operandd=3)


def test_guess_number_multi_turn(codec: Any) -> None:
    env = GuessNumberEnv(max_number=8, max_turns=4)
    task = Task(
        task_id="g",
        env="guess_number",
        roles={"agent": "p"},
        prompt="G8:",
        payload={"secret": 6, "max_number": 8},
    )
    state, obs = env.reset(task, codec, random.Random(0))
    step = asyncio.run(env.step(state, codec.ids("3"), codec))
    assert (step.observation, step.done) == (">", False)
    step = asyncio.run(env.step(state, codec.ids("x"), codec))
    assert step.observation == "!"
    step = asyncio.run(env.step(state, codec.ids("7"), codec))
    assert step.observation == "<"
    step = asyncio.run(env.step(state, codec.ids("6"), codec))
    assert step.done and step.reward == 1.0 and step.info["turns"] == 4
    state, _ = env.reset(task, codec, random.Random(0))
    for _ in range(3):
        assert not asyncio.run(env.step(state, codec.ids("1"), codec)).done
    last = asyncio.run(env.step(state, codec.ids("1"), codec))
    assert last.done and last.reward == 0.0


def test_bm25_golden_scores() -> None:
    index = BM25(["a b", "a c c", "d"], k1=1.5, b=0.75)
    # N=3, df(c)=1: idf = ln(1 + 2.5/1.5); doc 1: tf=2, |d|=3, avgdl=(2+3+1)/3=2
    import math

    idf = math.log(1 + 2.5 / 1.5)
    norm = 1.5 * (1 - 0.75 + 0.75 * 3 / 2)
    assert index.scores("c")[1] == pytest.approx(idf * 2 * 2.5 / (2 + norm))
    assert index.scores("c")[0] == 0.0
    assert index.search("a c", k=2)[0][0] == 1
    assert index.search("zzz") == []


def test_search_env_tool_use_with_latency(codec: Any) -> None:
    env = SearchEnv(tool_latency_s=0.05, max_turns=3)
    task = task_of(env)
    state, obs = env.reset(task, codec, random.Random(0))
    entity = obs.split(" of ")[1].rstrip("?\n")
    docs, facts = make_corpus(task.payload["corpus_seed"], task.payload["n_entities"])
    answer = task.payload["answer"]
    assert (entity, obs.split(" of ")[0], answer) in facts
    loop = asyncio.new_event_loop()
    import time

    t0 = time.monotonic()
    step = loop.run_until_complete(env.step(state, codec.ids(f"s {entity} {obs.split()[0]}\n"), codec))
    assert time.monotonic() - t0 >= 0.05
    assert f"{entity} {obs.split()[0]} {answer}" in step.observation
    done = loop.run_until_complete(env.step(state, codec.ids(f"a {answer}\n"), codec))
    assert done.done and done.reward == 1.0
    loop.close()


def test_code_env_rewards_passing_programs(codec: Any) -> None:
    env = CodeEnv()
    task = task_of(env)
    state, obs = env.reset(task, codec, random.Random(0))
    expr = obs.split("=", 1)[1].split("\n")[0]
    good = asyncio.run(env.step(state, [*codec.ids(expr), codec.eos], codec))
    assert good.reward == 1.0 and not good.info["truncated"]
    bad = asyncio.run(env.step(state, [*codec.ids("x-99999"), codec.eos], codec))
    assert bad.reward < 1.0 and bad.info["reason"]
    forged = "type('A',(),{'__eq__':lambda s,o:True})()"  # equal to everything: the judge never calls ==
    cheat = asyncio.run(env.step(state, [*codec.ids(forged), codec.eos], codec))
    assert cheat.reward == 0.0 and "not a plain JSON value" in cheat.info["reason"]
    assert good.info["isolation"] == "bwrap"  # `make test` installs bubblewrap


def test_code_env_scores_a_program_that_does_not_compile_without_the_sandbox(codec: Any) -> None:
    env = CodeEnv()
    state, _ = env.reset(task_of(env), codec, random.Random(0))
    broken = asyncio.run(env.step(state, [*codec.ids("x+)"), codec.eos], codec))
    assert broken.reward == 0.0 and broken.info["passed"] == 0 and broken.info["total"] == 7
    assert broken.info["reason"].startswith("SyntaxError") and broken.info["isolation"] == "not run"


def test_referential_views(codec: Any) -> None:
    env = ReferentialEnv()
    task = task_of(env)
    state, obs = env.reset(task, codec, random.Random(0))
    cands, target = task.payload["candidates"], task.payload["target"]
    assert obs == f"{cands}>{cands[target]}:"
    before, after = env.listener_prompt(state)
    assert cands[target] not in before.replace(cands, "") and ">" not in before
    assert env.success(state, codec.ids(cands[target]), codec)
    assert not env.success(state, codec.ids(cands[(target + 1) % len(cands)]), codec)


def test_registry_lists_known_names() -> None:
    with pytest.raises(ConfigError, match="known: .*arithmetic"):
        environment_class("nope")
    with pytest.raises(ConfigError, match="known: .*solve_and_verify"):
        workflow_class("nope")
    assert workflow_class("single_turn") is workflow_class("agent")


def test_checkpoint_tokenizer_keeps_whitespace(codec: Any) -> None:
    """Observations with spaces and newlines survive the checkpoint's tokenizer (AutoTokenizer's
    Qwen2Tokenizer would drop them)."""
    ids = codec.ids("s ab\nc")
    assert len(ids) == 6 and codec.text(ids) == "s ab\nc"
    with pytest.raises(ValueError, match="vocabulary"):
        codec.ids("é")
