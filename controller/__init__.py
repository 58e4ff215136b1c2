"""The rollout controller: runs harnesses as processes or Kubernetes Jobs, event-sourced on tether.rollouts.

Comes with issue 5.
"""
