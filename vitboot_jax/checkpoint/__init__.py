"""A run's checkpoints: the Checkpointer that saves and restores them (checkpointer), which step
directories count (step_dirs), their checksums, their failures said in one line on every process
(failures), and the read-only path of the tools and of init_from (reader)."""
