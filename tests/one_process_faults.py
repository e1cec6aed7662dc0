"""`python -m vitboot_jax.main` with a fault in this process alone, for the tests of one process
of a multi-process run failing: `python -m tests.one_process_faults FLAGS`, the faults named by
VITBOOT_TEST_FAULT (several: comma-separated):

- `unreadable`: every read of a checkpoint fails, as a damaged file makes it (the step is damaged);
- `restore`: restoring the state fails though the files read back in full (they are intact);
- `save`: orbax's save fails with a full disk;
- `save_before_agreement`: a save fails with a full disk before this process enters the save's
  agreement, so the others wait for it there;
- `background_save`: each save is written, then reported failed (a full disk) at the next
  `should_save`, as a background write's failure is, while the others go on to the next step;
- `killed_before_agreement`: this process is killed (SIGKILL) where a save's agreement begins,
  so the others wait for it there;
- `claim`: writing the workdir's claim fails with a full disk;
- `final`: writing final.json fails with a full disk;
- `slow_agreement`: this process reads a save's agreement only SLOW_S after writing its own part
  (a loaded host), so another's failure is published while it is still in the agreement;
- `slow_leaving`: leaving the run on its ending takes 3 SLOW_S more, so whatever this process's
  main thread does once the ending began shows before it exits.
"""

import errno
import os
import runpy
import signal
import time

# Long against what the faults race with (a thread's wake-up, a key-value read), short for a test.
SLOW_S = 2.0


def inject(faults: str) -> None:
  for fault in faults.split(","):
    _inject(fault)


def _inject(fault: str) -> None:
  import jax
  import orbax.checkpoint as ocp

  from vitboot_jax import sharding
  from vitboot_jax.checkpoint import checkpointer, failures
  from vitboot_jax.run import failing, metrics, workdir_claim, workdir_rules

  def failing_read(self, step, target):
    sharded = any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(target))
    if fault == "unreadable":
      raise ValueError(f"DATA_LOSS: injected: a file of step {step} cannot be read")
    if sharded:  # `restore`: the read into the run's shardings, not the check of the files.
      raise ValueError(f"injected: the arrays of step {step} cannot be placed")
    return read(self, step, target)

  def full_disk(directory, step):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"{directory}/{step}")

  def failing_save(self, step, *args, **kwargs):
    raise full_disk(self.directory, step)

  def failing_before_agreement(self, step, state, *, force=False):
    if not (force or self.should_save(step)):
      return False
    what = f"Saving step {step} under {self.directory}"
    message = self.write_failure(what, full_disk(self.directory, step))
    raise failures.CheckpointSaveError(message)

  def slow_collect(client, prefix, timeout_s):
    if "/checkpointer.save." in prefix:
      time.sleep(SLOW_S)
    return collect(client, prefix, timeout_s)

  def slow_leaving(leave_s):
    exit_in_order(leave_s)
    time.sleep(3 * SLOW_S)  # Outlasts the agreement's delay, whenever the ending began.

  if fault in ("unreadable", "restore"):
    read = checkpointer.Checkpointer._read
    checkpointer.Checkpointer._read = failing_read
  elif fault == "save":
    ocp.CheckpointManager.save = failing_save
  elif fault == "save_before_agreement":
    checkpointer.Checkpointer.save = failing_before_agreement
  elif fault == "background_save":
    save, should_save = checkpointer.Checkpointer.save, checkpointer.Checkpointer.should_save

    def saving_into_a_full_disk(self, step, state, *, force=False):
      saved = save(self, step, state, force=force)
      self.failed_in_background = self.failed_in_background or (saved and step)
      return saved

    def failing_at_the_next_should_save(self, step):
      if self.failed_in_background:
        what = f"Saving a checkpoint under {self.directory}"
        error = full_disk(self.directory, self.failed_in_background)
        raise failures.CheckpointSaveError(self.write_failure(what, error))
      return should_save(self, step)

    checkpointer.Checkpointer.failed_in_background = None
    checkpointer.Checkpointer.save = saving_into_a_full_disk
    checkpointer.Checkpointer.should_save = failing_at_the_next_should_save
  elif fault == "killed_before_agreement":

    def killed(self, step, state, *, force=False):
      if force or self.should_save(step):
        os.kill(os.getpid(), signal.SIGKILL)
      return False

    checkpointer.Checkpointer.save = killed
  elif fault == "claim":

    def full_at_the_claim(workdir):
      raise full_disk(workdir, workdir_claim.CLAIM_FILE)

    workdir_claim.acquire = full_at_the_claim
  elif fault == "final":
    write_json = metrics.write_json

    def failing_final(path, obj):
      if os.path.basename(path) == workdir_rules.FINAL_FILE:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
      write_json(path, obj)

    metrics.write_json = failing_final
  elif fault == "slow_agreement":
    collect = sharding._collect
    sharding._collect = slow_collect
  elif fault == "slow_leaving":
    exit_in_order = failing._exit_in_order
    failing._exit_in_order = slow_leaving
  else:
    raise ValueError(f"VITBOOT_TEST_FAULT={fault!r} is not a fault")


if __name__ == "__main__":
  inject(os.environ["VITBOOT_TEST_FAULT"])
  runpy.run_module("vitboot_jax.main", run_name="__main__", alter_sys=True)
