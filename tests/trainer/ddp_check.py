"""Run by test_distributed.py, alone or under torchrun: three TrainEngine steps on fixed batches,
exchanged from rank 0 as the trainer does; rank 0 saves the step-1 gradients and final weights.
An optional second argument names the policy loss (m2po: its mask is cut on every rank's tokens)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from astraflow.config.trainer import LossConfig, TrainerConfig
from tests.trainer.helpers import exchanged_batch, tiny_model
from trainer import distributed
from trainer.engine import TrainEngine


def main(out: Path, policy_loss: str = "ppo") -> None:
    torch.manual_seed(0)
    dist = distributed.init("cpu")
    loss = LossConfig.model_validate({"policy_loss": policy_loss, "m2_threshold": 1.0})  # from argv
    cfg = TrainerConfig(lr=1e-4, micro_batch_tokens=48, max_grad_norm=1.0, loss=loss)
    engine = TrainEngine(tiny_model(), cfg, torch.device("cpu"), distributed=dist.enabled, pad_id=0)
    for step in (1, 2, 3):
        mine, num_tokens, num_seqs = exchanged_batch(dist, step)
        stats = engine.step(mine, step, num_tokens, num_seqs)
        if step == 1 and dist.leader:
            grads = {k: p.grad.clone() for k, p in engine.model.named_parameters() if p.grad is not None}
            save_file(grads, str(out / "grads.safetensors"))
            (out / "loss.txt").write_text(repr(stats["loss"]))
            (out / "stats.json").write_text(json.dumps(stats))
    if dist.leader:
        save_file(
            {k: v.clone().contiguous() for k, v in engine.state_dict().items() if k != "lm_head.weight"},
            str(out / "weights.safetensors"),
        )
    distributed.shutdown(dist)


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:])
