"""Faust stream processors: join calls to rollouts, assemble task groups, feed analytics (issue 6)."""
