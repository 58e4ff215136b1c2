"""Stream processors: calls joined to rollouts, task groups to tether.samples, analytics to ClickHouse."""
