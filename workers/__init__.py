"""Rollout workers: inference engines, environments and workflows, and the task feeder."""
