"""The trainer component: per-policy consumers of samples, policy-gradient losses, checkpoints and
weight publication."""
