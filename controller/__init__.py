"""The rollout controller: tasks in, K rollouts per task out, each one run of an unmodified harness."""
