"""Stream processors: calls joined to rollouts, rollouts grouped by task, task groups to tether.samples."""
