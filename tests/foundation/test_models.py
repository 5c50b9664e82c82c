"""Tiny models and the project's tokenizer: they load with plain transformers (AutoTokenizer,
AutoModelForCausalLM) and behave the same whichever way they are loaded."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from astraflow.config import ModelSpec
from astraflow.models import BASE_ALPHABET, build_model, build_tokenizer, init_checkpoint
from tests.conftest import REPO, subprocess_env

TINY = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
TEXTS = [BASE_ALPHABET, "a b", " x", "x\n\ny", "  ", "G8:>", "def f(x):\n    return x+1\n", "it's  fine"]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_checkpoint_loads_with_plain_transformers_and_tokenizes_identically(
    arch: str, tmp_path: Path
) -> None:
    path = init_checkpoint(ModelSpec(architecture=arch, **TINY), tmp_path / "ck")
    ours = build_tokenizer()
    for tok in (AutoTokenizer.from_pretrained(path), PreTrainedTokenizerFast.from_pretrained(path)):
        for text in TEXTS:
            ids = ours(text).input_ids
            assert tok(text).input_ids == ids, (type(tok).__name__, text)
            assert len(ids) == len(text)  # one token per character
            assert tok.decode(ids) == text
        assert tok.eos_token_id == ours.eos_token_id and tok.pad_token_id == ours.pad_token_id
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.model_type == arch
    prompt = torch.tensor([ours("3+4=").input_ids])
    out = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=ours.pad_token_id)
    assert out.shape[1] > prompt.shape[1]


def test_out_of_alphabet_characters_become_unk_not_nothing() -> None:
    tok = build_tokenizer()
    assert tok("é").input_ids == [tok.unk_token_id] * 2  # two UTF-8 bytes, neither in the alphabet
    with pytest.raises(ValueError, match="single-byte"):
        from astraflow.config import TokenizerSpec

        build_tokenizer(TokenizerSpec(extra_chars="é"))


def test_a_recipes_own_alphabet_is_the_whole_vocabulary(tmp_path: Path) -> None:
    from astraflow.config import TokenizerSpec
    from workers.envs.base import Codec

    spec = ModelSpec(tokenizer=TokenizerSpec(alphabet="ABCD>|:"), **TINY)
    path = init_checkpoint(spec, tmp_path / "ck")
    for tok in (AutoTokenizer.from_pretrained(path), build_tokenizer(spec.tokenizer)):
        assert len(tok) == 4 + 7  # <pad> <bos> <eos> <unk> and the seven characters
        assert tok("AC>C:").input_ids == tok("A").input_ids + tok("C>C:").input_ids
        assert len(tok("AC|B:").input_ids) == 5 and tok.decode(tok("AC|B:").input_ids) == "AC|B:"
    assert AutoModelForCausalLM.from_pretrained(path).config.vocab_size == 11
    with pytest.raises(ValueError, match=r"\['E'\] are not in the tokenizer's vocabulary"):
        Codec(build_tokenizer(spec.tokenizer)).ids("AE")  # an environment's text outside the alphabet


def test_same_spec_same_weights_and_seed_matters() -> None:
    a, b = build_model(ModelSpec(**TINY)), build_model(ModelSpec(**TINY))
    c = build_model(ModelSpec(seed=1, **TINY))
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    assert not all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), c.state_dict().values(), strict=True)
    )


def _init(path: str) -> str:
    return str(init_checkpoint(ModelSpec(**TINY), path))


def test_concurrent_initialisation_yields_one_complete_checkpoint(tmp_path: Path) -> None:
    target = tmp_path / "init" / "p"
    with ProcessPoolExecutor(4) as pool:
        assert set(pool.map(_init, [str(target)] * 4)) == {str(target)}
    assert {p.name for p in target.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert [p for p in target.parent.iterdir() if p.name.startswith(".")] == []  # no leftovers


@pytest.mark.slow
def test_initialisation_under_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "init.py"
    script.write_text(
        "import os, sys, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "from astraflow.config import ModelSpec\n"
        "from astraflow.models import init_checkpoint, _complete\n"
        f"p = init_checkpoint(ModelSpec(**{TINY!r}), sys.argv[1])\n"
        "dist.barrier()\n"
        "assert _complete(p)\n"
        "os.write(1, f'rank {dist.get_rank()} ok\\n'.encode())\n"
        "dist.destroy_process_group()\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            str(script),
            str(tmp_path / "ck"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(),
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # one write(2) per rank, which a pipe keeps whole: print makes two (the text, then its end),
    # and CI saw 'rank 1 okrank 0 ok' and 'rank 1 rankok 0 ok' from the two ranks' interleaved pieces
    assert sorted(line for line in result.stdout.splitlines() if line.endswith(" ok")) == [
        "rank 0 ok",
        "rank 1 ok",
    ]
