"""The streams component: a Faust app of composable data algorithms (trajectories -> samples)."""
