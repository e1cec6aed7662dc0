"""Checkpoints of the training state: a thin, resume-safe layer over an orbax CheckpointManager.

Layout: `<workdir>/checkpoints/<step>/`, one orbax step directory per saved step; only committed
steps count, and saves a kill cut short are moved aside at start-up (step_dirs.py). All
processes call every method. Whatever one process finds (a damaged step, a failed read, a file in
the way of a save) every process learns (failures.agreed) before anyone acts, so all
fall back, skip or raise the same line together and none enters a collective another has left.

Writing. `save` never deletes or overwrites a step directory that exists on disk, whoever wrote
it. A save that fails in any way (full disk, lost permissions, quota, any orbax or tensorstore
error) raises `CheckpointSaveError`: one line naming the directory, the cause, the fix and the
newest complete step, which is left intact. A background write's failure is raised at the next
`should_save` (called every step), not only at the next save.

Integrity. Every save records the size and CRC32 of its files (checksums.py), and a restore
verifies them first. A step that fails verification, or to read back on its own terms, is
damaged: `restore_latest` moves it to `checkpoints/damaged/` with one warning and falls back to
the next older step (none intact: `DamagedCheckpointsError`, exit 2); a read-only Checkpointer
refuses it by name. Only damage process 0 finds itself moves a step (it is the one that moves
it): a step that another process alone cannot read (a lagging file-system view, a transient
error) stops the run with one line, and nothing is moved. A changed model or config
(`CheckpointMismatchError`) or a bad requested sharding (`CheckpointError`) leaves the intact
files where they are.

Output. What orbax, tensorstore and asyncio log about a save or restore (hundreds of lines of
tracebacks for one failure) is held while it is outstanding, dropped when we raise its failure
in one line and shown when it succeeds (library_logs.py). The tools' read-only path is
checkpoint/reader.py; the messages are failures.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from vitboot_jax import sharding
from vitboot_jax.base import errors, library_logs
from vitboot_jax.checkpoint import checksums, failures, step_dirs
from vitboot_jax.run import workdir_claim, workdir_rules

PyTree = Any


class Checkpointer:
  """Saves and restores the train state under `<workdir>/checkpoints`.

  Call `save` after every step (it decides itself whether to write), `restore_latest` once at
  start-up, and `close` at the end so an asynchronous save in flight is completed.
  """

  def __init__(
    self,
    workdir: epath.PathLike,
    *,
    keep: int | None = 3,
    save_every_steps: int | None = None,
    async_save: bool = True,
    read_only: bool = False,
  ):
    """Opens (creating if needed) the checkpoint directory of `workdir`.

    Args:
      workdir: The run's directory (local path or a URL such as gs://...).
      keep: How many of the newest checkpoints to keep; None keeps all.
      save_every_steps: Save at positive multiples of this step; None saves only when forced
        (and on a preemption notice).
      async_save: Write to disk in a background thread once arrays are copied to host memory,
        so training (and buffer donation) continues during the write.
      read_only: Only restore (tools): create, move and delete nothing, so a tool pointed at a
        live run never touches its saves.
    """
    if keep is not None and keep < 1:
      raise ValueError(f"keep must be >= 1 or None, got {keep}.")
    if save_every_steps is not None and save_every_steps < 1:
      raise ValueError(f"save_every_steps must be >= 1 or None, got {save_every_steps}.")
    # Orbax refuses relative paths (at the first save, deep inside training), and a user's
    # `--workdir=runs/x` is relative to where they launched.
    self._workdir = step_dirs.absolute(workdir)
    self._directory = self._workdir / workdir_rules.CHECKPOINT_SUBDIR
    self._save_every = save_every_steps
    self._name_format = step_dirs.CommittedStepsFormat()
    self._read_only = read_only
    if not read_only:
      step_dirs.set_aside_incomplete(self._workdir, self._directory)
    # Registered up front so a fresh manager can read a step's metadata before any restore.
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    for args_type in (ocp.args.StandardSave, ocp.args.StandardRestore):
      registry.add(step_dirs.ITEM, args_type, checksums.ChecksummedHandler)
    self._writes_held = False  # A save's library failure reports are held until it settles.
    self._manager = ocp.CheckpointManager(
      self._directory,
      options=ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        step_name_format=self._name_format,
        enable_async_checkpointing=async_save,
        create=not read_only,
        read_only=read_only,
      ),
      handler_registry=registry,
    )

  @property
  def directory(self) -> epath.Path:
    return self._directory

  def step_dir(self, step: int) -> epath.Path:
    """The directory that holds (or will hold) the checkpoint of `step`."""
    return self._directory / self._name_format.build_name(int(step))

  def all_steps(self) -> list[int]:
    """Complete steps, oldest first (plus a save of this process still being written)."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    """The newest complete step, or None; call `wait()` first if a save may be in flight."""
    return self._manager.latest_step()

  def should_save(self, step: int) -> bool:
    """Whether `save(step, ...)` without force writes: a positive multiple of the interval.

    Also raises CheckpointSaveError as soon as a background save has failed, so a loop that asks
    every step learns of it at once rather than at the next save.
    """
    if self._writes_held and not self._manager.is_saving_in_progress():
      self.wait()  # Raises a background save's failure, or shows what orbax logged meanwhile.
    return bool(self._save_every) and step > 0 and step % self._save_every == 0

  def save(self, step: int, state: PyTree, *, force: bool = False) -> bool:
    """Saves `state` as step `step` if it is due (or `force`); returns whether it saved.

    `state` is any pytree of jax.Arrays (sharded or not, typed PRNG keys included), numpy arrays
    and Python scalars. A step that is already saved is left untouched, never overwritten.
    """
    step = int(step)
    if not (force or self.should_save(step)):
      return False
    if self._read_only:
      raise failures.CheckpointError(f"This Checkpointer of {self._directory} is read-only.")
    try:
      claim = workdir_claim.held(self._workdir)
      if claim is not None:
        claim.check()  # A run whose workdir was taken over writes nothing more.
      with self._naming_save_failures(step):
        self._check_before_save(step)
      refusal = None
    except (failures.CheckpointError, workdir_claim.WorkdirBusyError) as error:
      refusal = error
    # Orbax's save starts with a barrier of every process: all must enter it, or none.
    refusal = failures.agreed(f"checkpoint.save.{step}", refusal)
    if isinstance(refusal, failures.AlreadySaved):
      return False
    if refusal is not None:
      raise refusal
    if not self._writes_held:
      library_logs.hold_library_failures()
      self._writes_held = True
    with self._naming_save_failures(step):
      # Due-ness is decided above; force=True keeps orbax from re-deciding with its own policy.
      saved = self._manager.save(step, args=ocp.args.StandardSave(state), force=True)
    if not self._manager.is_saving_in_progress():  # Synchronous, or a background save done.
      self.wait()  # Raises its failure now, or shows what orbax logged.
    return saved

  def _check_before_save(self, step: int) -> None:
    """Raises what stops this process from saving `step` (AlreadySaved: skip it)."""
    if step in self._manager.all_steps():
      logging.info("Checkpoint for step %d already exists; not overwriting it.", step)
      raise failures.AlreadySaved(str(step))
    # Orbax's save replaces an existing directory of the step (it saves with force): look on
    # disk, where another writer (a second Checkpointer, a copy) may have put one since start-up.
    if step_dirs.has_marker(self.step_dir(step)):
      logging.warning("Checkpoint %s already exists; not overwriting it.", self.step_dir(step))
      raise failures.AlreadySaved(str(step))
    other = step_dirs.foreign_save(self._directory, self._name_format.build_name(step))
    if other is not None:
      raise failures.foreign_save_error(step, self._directory, other)

  def restore(self, abstract_state: PyTree, step: int) -> PyTree:
    """Restores step `step` with the dtypes and shardings of `abstract_state`.

    Args:
      abstract_state: The state's pytree with jax.ShapeDtypeStruct leaves carrying `.sharding`
        (e.g. `jax.eval_shape` of the init plus the shardings), so each array is read straight
        into its shards.
      step: A complete step.

    Raises:
      CorruptCheckpointError: The step fails its checksums, or its files cannot be read.
      CheckpointMismatchError: The checkpoint is readable but its tree or shapes differ.
      CheckpointError: The files are intact but cannot be restored as requested.
    """
    with library_logs.library_failures_held():  # Any error leaving is ours, in one line.
      return self._restore(abstract_state, int(step))

  def _restore(self, abstract_state: PyTree, step: int) -> PyTree:
    damage = None
    if jax.process_index() == 0:  # One reader of the record suffices: the files are shared.
      problem = checksums.verify(self.step_dir(step))
      damage = None if problem is None else self._corrupt(step, problem)
    damage = failures.agreed(f"checkpoint.verify.{step}", damage)
    if damage is not None:
      raise damage
    restored, failure = None, None
    try:
      restored = self._read(step, abstract_state)
    except Exception as error:  # Any failure: classify it and say what to do.
      failure = self._explain_failure(step, abstract_state, error)
      failure.__cause__ = error
    per_process = failures.each_process(f"checkpoint.restore.{step}", failure)
    process, failure = next(((p, f) for p, f in enumerate(per_process) if f is not None), (0, None))
    if isinstance(failure, failures.CorruptCheckpointError) and process > 0:
      # Process 0 moves a damaged step, and it reads this one: one host's say is not damage.
      failure = failures.unconfirmed_damage_error(self.step_dir(step), process, failure.cause)
    if failure is not None:
      raise failure
    return restored

  def _read(self, step: int, target: PyTree) -> PyTree:
    """Reads step `step` into `target`'s dtypes and shardings, on this process alone.

    Orbax's restore ends in a barrier of every process, where the others would wait for ever
    for one whose read failed: `restore` agrees on the outcome after reading instead.
    """
    handler = ocp.StandardCheckpointHandler()
    try:
      item = self.step_dir(step) / step_dirs.ITEM
      return handler.restore(item, args=ocp.args.StandardRestore(target))
    finally:
      handler.close()

  def _explain_failure(self, step: int, abstract_state: PyTree, error: Exception) -> Exception:
    """Tells damaged files (drop the step) from a changed model or sharding (keep the files).

    Only calls the files damaged when they fail to read back on their own terms, so a bug in
    the requested state never leads to advice to delete a good checkpoint. Reads on this process
    alone (no collective): `restore` agrees on the verdict afterwards.
    """
    cause = errors.first_line(error)
    try:
      metadata = self._manager.item_metadata(step)
      if metadata is None:
        raise ValueError(f"orbax found no readable item {step_dirs.ITEM!r}")
      stored_tree = getattr(metadata, "tree", metadata)
    except Exception as metadata_error:  # Unreadable metadata is damage.
      return self._corrupt(
        step, f"{cause}; reading its metadata failed too: {errors.first_line(metadata_error)}"
      )
    mismatch = failures.mismatch_error(self.step_dir(step), stored_tree, abstract_state)
    if mismatch is not None:
      return mismatch
    try:  # Read every array into host memory, free of the requested dtypes and shardings.
      host_target = jax.tree.map(
        lambda m: np.empty(m.shape, getattr(m, "dtype", None) or np.float32), stored_tree
      )
      self._read(step, host_target)
    except Exception as read_error:
      return self._corrupt(step, errors.first_line(read_error))
    return failures.unrestorable_error(self.step_dir(step), cause)

  def _corrupt(self, step: int, cause: str) -> failures.CorruptCheckpointError:
    return failures.damaged_step_error(self.step_dir(step), cause, self.all_steps())

  def restore_latest(self, abstract_state: PyTree) -> tuple[PyTree, int] | None:
    """Restores the newest intact checkpoint as `(state, step)`, or returns None if none exists.

    A damaged step is moved to `damaged/` with a warning and the next older one is tried; a
    read-only Checkpointer refuses it instead (CorruptCheckpointError), moving nothing.

    Raises:
      DamagedCheckpointsError: Checkpoints existed but every one was damaged (all moved aside).
    """
    self.wait()
    damaged: list[str] = []
    while True:
      # All hosts must read the same step even if their views of the directory differ.
      views = sharding.exchange("checkpoint.latest_step", json.dumps(self.latest_step()))
      step = json.loads(views[0])
      if step is None:
        break
      logging.info("Restoring checkpoint %s.", self.step_dir(step))
      try:
        return self.restore(abstract_state, step), step
      except failures.CorruptCheckpointError as error:  # Raised on every process.
        if self._read_only:
          raise
        problem = error.cause
      damaged.append(f"step {step} ({problem})")
      step_dirs.set_aside_damaged(self.step_dir(step), problem)
      self._manager.reload()  # Orbax forgets the step moved out of its sight.
    if damaged:
      raise failures.no_intact_step_error(self._directory, damaged)
    return None

  def wait(self) -> None:
    """Blocks until any asynchronous save has been committed (and re-raises its error)."""
    with self._naming_save_failures(None):
      self._manager.wait_until_finished()
    self._settle_writes(reported=False)

  def close(self) -> None:
    """Completes pending saves and releases orbax's threads."""
    self.wait()
    self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.close()

  @contextlib.contextmanager
  def _naming_save_failures(self, step: int | None) -> Iterator[None]:
    """Turns a failed write (often reported by a background save) into CheckpointSaveError."""
    try:
      yield
    except failures.CheckpointError:
      self._settle_writes(reported=True)
      raise
    except Exception as error:  # Orbax and tensorstore raise many types; each is one line.
      self._settle_writes(reported=True)
      what = f"step {step}" if step is not None else "a checkpoint"
      message = self.write_failure(f"Saving {what} under {self._directory}", error)
      raise failures.CheckpointSaveError(message) from error

  def _settle_writes(self, reported: bool) -> None:
    if self._writes_held:
      self._writes_held = False
      library_logs.settle_library_failures(reported)

  def write_failure(self, what: str, error: BaseException) -> str:
    """One line for a failed write into the run: `what` (e.g. "Writing RUN/metrics.jsonl"), the
    cause, its fix, and the newest complete checkpoint, from which a re-run resumes."""
    try:
      complete = [s for s in self.all_steps() if step_dirs.has_marker(self.step_dir(s))]
    except Exception:  # The directory itself may be unreadable now.
      complete = None
    return failures.write_failure(what, error, complete)
