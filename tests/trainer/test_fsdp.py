"""FSDP2 (`trainer.parallel: fsdp`) under torchrun with 2 gloo processes on CPU trains exactly as one
process does, writes full Hugging Face checkpoints, and resumes from them with its optimiser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import REPO
from tests.trainer.helpers import run_check

pytestmark = pytest.mark.slow
SCRIPT = str(REPO / "tests" / "trainer" / "fsdp_check.py")


def run(out: Path, nproc: int, parallel: str, first: int, last: int, resume: Path | None = None) -> None:
    args = [parallel, str(first), str(last), *([str(resume)] if resume else [])]
    run_check(SCRIPT, out, nproc, *args)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_fsdp_matches_one_process_checkpoints_in_hf_layout_and_resumes(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    run(tmp_path / "one", 1, "ddp", 1, 4)  # the reference: four steps, uninterrupted
    run(tmp_path / "fsdp", 2, "fsdp", 1, 3)  # three steps, checkpoint
    ckpt = tmp_path / "fsdp" / "checkpoints" / "step-00000003"
    run(tmp_path / "resumed", 2, "fsdp", 4, 4, resume=ckpt)  # a fresh job resumes and takes step 4

    one, fsdp = tmp_path / "one", tmp_path / "fsdp"
    s1, s2 = (json.loads((d / "stats.json").read_text()) for d in (one, fsdp))
    assert s2["loss"] == pytest.approx(s1["loss"], rel=1e-5)
    # M2PO's mask is cut on both ranks' tokens, as in one process (its extra forward is padded too)
    assert 0 < s1["m2po.masked_fraction"] < 1 and s2["m2po.masked_fraction"] == s1["m2po.masked_fraction"]
    g1, g2 = load_file(str(one / "grads.safetensors")), load_file(str(fsdp / "grads.safetensors"))
    for k in g1:  # the same batch-wide gradient, reduce-scattered instead of summed in one process
        torch.testing.assert_close(g2[k], g1[k], rtol=1e-4, atol=1e-7)
    for step in (1, 2, 3):
        w1, w2 = (load_file(str(d / f"weights-{step}.safetensors")) for d in (one, fsdp))
        assert max_diff(w1, w2) < 1e-6, step

    # the checkpoint is the full state dict in HF layout: plain from_pretrained loads it, tied head included
    loaded = AutoModelForCausalLM.from_pretrained(str(ckpt)).state_dict()
    w3 = load_file(str(one / "weights-3.safetensors"))
    assert max_diff({k: loaded[k] for k in w3}, w3) < 1e-6
    assert torch.equal(loaded["lm_head.weight"], loaded["model.embed_tokens.weight"])

    # resume restores the AdamW moments: step 4 lands where the uninterrupted run's step 4 did
    # (a fresh optimiser would move every weight by about lr = 1e-3 instead)
    w4, r4 = (
        load_file(str(one / "weights-4.safetensors")),
        load_file(str(tmp_path / "resumed" / "weights-4.safetensors")),
    )
    assert max_diff(w4, w3) > 1e-4
    assert max_diff(r4, w4) < 2e-6
