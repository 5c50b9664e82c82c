"""Built-in environments (see `workers.registry` for how plug-ins add more)."""

from workers.envs.base import Codec, Environment, Step, TaskSpec, cycle_pool

__all__ = ["Codec", "Environment", "Step", "TaskSpec", "cycle_pool"]
