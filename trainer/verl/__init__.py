"""The verl backend: the same learner contract on verl's Ray/FSDP actor workers."""
