"""Clip (PPO) vs M2PO vs GSPO vs CISPO (`trainer.loss.policy_loss`) on one recipe and the same seeds:
reward (first, last and best tenth), stale drops and on-policy mismatch per loss (bench/variants.py).

    python -m bench.loss_compare [RECIPE] [--values ppo,m2po,gspo,cispo] [--seeds 3] [--steps 80]
        [--bootstrap HOST:PORT]
"""

from __future__ import annotations

from bench.variants import cli

if __name__ == "__main__":
    cli(
        recipe="guess_number",
        key="trainer.loss.policy_loss",
        values="ppo,m2po,gspo,cispo",
        name="loss_compare",
    )
