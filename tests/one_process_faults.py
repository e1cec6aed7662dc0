"""`python -m vitboot_jax.main` with a fault in this process alone, for the tests of one process
of a multi-process run failing: `python -m tests.one_process_faults FLAGS`, the fault named by
VITBOOT_TEST_FAULT:

- `unreadable`: every read of a checkpoint fails, as a damaged file makes it (the step is damaged);
- `restore`: restoring the state fails though the files read back in full (they are intact);
- `save`: orbax's save fails with a full disk.
"""

import errno
import os
import runpy


def inject(fault: str) -> None:
  import jax
  import orbax.checkpoint as ocp

  from vitboot_jax import checkpoint

  def failing_read(self, step, target):
    sharded = any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(target))
    if fault == "unreadable":
      raise ValueError(f"DATA_LOSS: injected: a file of step {step} cannot be read")
    if sharded:  # `restore`: the read into the run's shardings, not the check of the files.
      raise ValueError(f"injected: the arrays of step {step} cannot be placed")
    return read(self, step, target)

  def failing_save(self, step, *args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"{self.directory}/{step}")

  if fault in ("unreadable", "restore"):
    read = checkpoint.Checkpointer._read
    checkpoint.Checkpointer._read = failing_read
  elif fault == "save":
    ocp.CheckpointManager.save = failing_save
  else:
    raise ValueError(f"VITBOOT_TEST_FAULT={fault!r} is not a fault")


if __name__ == "__main__":
  inject(os.environ["VITBOOT_TEST_FAULT"])
  runpy.run_module("vitboot_jax.main", run_name="__main__", alter_sys=True)
