"""Run by test_fsdp.py, alone or under torchrun: TrainEngine steps on fixed batches exchanged from rank 0
as the trainer does, with `trainer.parallel` = argv[2]. Steps argv[3]..argv[4] (1-based, inclusive);
with argv[5], the run resumes from that checkpoint (weights and optimiser) instead of the initial
model. Rank 0 saves the first step's gradients and loss, the weights after every step, and a
checkpoint (save_checkpoint, as the trainer writes it) after the last step."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from astraflow.config.trainer import LossConfig, TrainerConfig
from astraflow.models import init_checkpoint, load_model, load_tokenizer
from tests.trainer.helpers import TINY, exchanged_batch
from trainer import checkpoint as ckpt
from trainer import distributed, sharding
from trainer.engine import TrainEngine


def main(out: Path, parallel: str, first: int, last: int, resume: str | None = None) -> None:
    dist = distributed.init("cpu")
    init = init_checkpoint(TINY, out.parent / "init")
    source = Path(resume) if resume else init
    loss = LossConfig(policy_loss="m2po", m2_threshold=1.0)
    cfg = TrainerConfig.model_validate(  # `parallel` comes from argv
        {"lr": 1e-3, "micro_batch_tokens": 48, "max_grad_norm": 1.0, "loss": loss, "parallel": parallel}
    )
    model = load_model(source)
    tokenizer = load_tokenizer(init)
    engine = TrainEngine(model, cfg, torch.device("cpu"), distributed=dist.enabled, pad_id=0)
    if resume:
        engine.load_optimizer(ckpt.read_optimizer(Path(resume)))
    for step in range(first, last + 1):
        # rows of uneven lengths: ranks get different micro-batch counts
        mine, num_tokens, num_seqs = exchanged_batch(dist, step)
        stats = engine.step(mine, step, num_tokens, num_seqs)
        if step == first:  # gathering a sharded gradient is a collective: every rank takes part
            grads = {
                k: sharding.full_tensor(p.grad).clone()
                for k, p in engine.model.named_parameters()
                if p.grad is not None
            }
            if dist.leader:
                save_file(grads, str(out / "grads.safetensors"))
                (out / "stats.json").write_text(json.dumps(stats))
        model_state, optimizer_state = engine.full_state()
        if dist.leader:
            assert model_state is not None and optimizer_state is not None
            save_file(
                {k: v.detach().clone().contiguous() for k, v in model_state.items() if k != "lm_head.weight"},
                str(out / f"weights-{step}.safetensors"),
            )
            if step == last:
                snap = ckpt.snapshot(step, model_state, optimizer_state, {"version": step})
                ckpt.save_checkpoint(out / "checkpoints", snap, model, tokenizer)
    distributed.shutdown(dist)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:])
