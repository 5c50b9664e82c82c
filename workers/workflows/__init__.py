"""Built-in workflows (episode programs); see `workers.registry` for plug-ins."""

from workers.workflows.base import EpisodeContext, View, Workflow

__all__ = ["EpisodeContext", "View", "Workflow"]
