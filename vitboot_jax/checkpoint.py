"""Checkpoints of the training state: a thin, resume-safe layer over an orbax CheckpointManager.

Layout: `<workdir>/checkpoints/<step>/`, one orbax step directory per saved step. All processes
call every method (orbax coordinates multi-host writes itself; nothing here writes from one host).
Whatever one process finds (a damaged or unreadable step, a failed read, a file in the way of a
save, a step that cannot be moved aside) every process learns through jax.distributed's key-value
store before anyone acts, so all fall back, skip or raise the same one line together; no process
enters a collective (orbax's barriers among them) that another has left.

Completeness. Orbax 0.12 writes a step into `<step>.orbax-checkpoint-tmp` and, once every array
is on disk, writes `commit_success.txt` into it and renames it to `<step>` (atomic on POSIX). On
object stores (gs://) it writes in place and the marker alone marks the commit. So a step counts
only if its directory has the final name AND holds `commit_success.txt`; both are checked through
the step-name format handed to orbax, so orbax's own step list, its keep-last-K deletion and its
restore never see a save that a kill cut short. A step directory without the marker would block
the resumed run from saving that step again, so at start-up, and only then, it is moved aside into
`checkpoints/incomplete/<name>-<UTC time>` (logged), never deleted. The run holds the workdir's
claim (workdir_claim.py) by then, so nothing moved can be another live run's save in progress;
if another run holds the claim, or the Checkpointer is read-only (tools), nothing is moved.

Writing. `save` never deletes or overwrites a step directory that exists on disk, whoever wrote
it. A save that fails in any way (full disk, lost permissions, quota, any orbax or tensorstore
error) raises `CheckpointSaveError`: one line naming the directory, the cause, the fix and the
newest complete step, which is left intact. A background write's failure is raised at the next
`should_save` (called every step), not only at the next save.

Integrity. Before the commit marker is written, process 0 records the size and CRC32 of every file
the save wrote in `<step>/checksums.json` (in orbax's background finalisation, so the training
loop never waits for it). Restoring verifies them first: bit rot, a bad copy, a truncated or a
missing file is found before a single array is used. A step that fails verification, or that
fails to read back on its own terms, is damaged: `restore_latest` moves it to
`checkpoints/damaged/<step>-<UTC time>` (never deleted) with one warning and falls back to the
next older step; if none is intact it raises `DamagedCheckpointsError` (exit 2) naming them all.
Read-only readers (the tools, `init_from`) move nothing and refuse a damaged step by name. A
step whose record is gone is damaged too (its metadata says its save wrote one); only steps saved
before checksums existed restore unverified, with a warning.
A changed model or config raises `CheckpointMismatchError` and a bad requested sharding a plain
`CheckpointError`: those files are intact and never moved.

Output. Orbax, tensorstore and asyncio log a failed save or restore several times over (hundreds
of lines of background tracebacks); the error raised here says it in one line, so what they log
while a save or restore is outstanding is held, dropped when it fails and shown when it does not;
at debug verbosity (`--verbosity=1`) everything shows (quiet.py).

The record itself is checksums.py. This module stays over 500 lines because its one concern, the
Checkpointer's life cycle, cannot be read in parts: each step of save, restore and start-up
(incomplete and damaged steps set aside) carries the failure it turns into one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from vitboot_jax import checksums, errors, quiet, sharding, workdir_claim
from vitboot_jax.checksums import CHECKSUM_FILE, verify  # noqa: F401 (the readers' names)
from vitboot_jax.workdirs import CHECKPOINT_SUBDIR, COMMIT_MARKER

PyTree = Any

# The layout (checkpoints/<step>/commit_success.txt) is defined once in workdirs.py, which the
# entry point reads before JAX and orbax load.
_TMP_TAG = ".orbax-checkpoint-tmp"
# Where step directories of saves that never finished are moved, out of orbax's sight.
INCOMPLETE_SUBDIR = "incomplete"
# Where damaged steps are moved, out of orbax's sight (never deleted).
DAMAGED_SUBDIR = "damaged"
# The item name orbax gives a single unnamed item (the step's `default/` subdirectory).
_ITEM = checksums.ITEM


class CheckpointError(RuntimeError):
  """A checkpoint exists but cannot be used as it is; the message gives the fix."""


class CorruptCheckpointError(CheckpointError, errors.UsageError):
  """A complete checkpoint whose files fail their checksums or cannot be read (exit 2).

  `step` and `cause` say which step and what failed, for a caller that falls back.
  """

  def __init__(self, message: str, step: int | None = None, cause: str = ""):
    super().__init__(message)
    self.step = step
    self.cause = cause


class DamagedCheckpointsError(CorruptCheckpointError):
  """Every complete checkpoint was damaged; all were moved to `checkpoints/damaged/`."""


class CheckpointMismatchError(CheckpointError):
  """A readable checkpoint whose tree or shapes differ from the state being restored."""


class CheckpointSaveError(CheckpointError):
  """A save failed (full disk, permissions); the complete checkpoints before it are intact."""


class _AlreadySaved(CheckpointError):
  """The step is on disk already: every process skips its save."""


@dataclasses.dataclass(frozen=True)
class _CommittedStepsFormat:
  """Orbax's standard step naming, minus step directories that lack the commit marker.

  Orbax only checks the marker on object stores; checking it everywhere also keeps a
  half-copied directory (e.g. an interrupted `cp -r` of a workdir) out of restores and out of
  the keep-last-K count, where it could push a good checkpoint out.
  """

  base: Any = dataclasses.field(default_factory=ocp.step.standard_name_format)

  def build_name(self, step: int) -> str:
    return self.base.build_name(step)

  def find_all(self, base_path: epath.PathLike) -> Iterator[Any]:
    for metadata in self.base.find_all(base_path):
      if _has_marker(metadata.path):
        yield metadata
      else:
        logging.warning(
          "Ignoring checkpoint %s: it has no %s, so its save never finished.",
          metadata.path,
          COMMIT_MARKER,
        )

  def find_step(self, base_path: epath.PathLike, step: int) -> Any:
    metadata = self.base.find_step(base_path, step)
    if not _has_marker(metadata.path):
      raise ValueError(f"Checkpoint {metadata.path} has no {COMMIT_MARKER}; it is incomplete.")
    return metadata


def _has_marker(step_dir: epath.PathLike) -> bool:
  return (epath.Path(step_dir) / COMMIT_MARKER).exists()


class _ChecksummedHandler(ocp.StandardCheckpointHandler):
  """Orbax's handler, recording every file's checksum once the item's files are final, and
  flagging in the item's metadata that it does (checksums.py).

  Orbax calls `finalize` on process 0 only, after every process's writes have finished and
  before the commit marker: in the background thread of an asynchronous save.
  """

  async def async_save(self, directory: Any, item=None, save_args=None, args=None) -> Any:
    if args is not None:  # A synchronous `save` runs through here too.
      args = dataclasses.replace(args, custom_metadata=checksums.with_flag(args.custom_metadata))
    return await super().async_save(directory, item, save_args, args)

  def finalize(self, directory: epath.Path) -> None:
    super().finalize(directory)  # Merges the per-process databases: the last write of the item.
    directory = epath.Path(directory)
    # `directory` may still carry orbax's temporary name; it becomes `<step>/default`.
    # Before the commit marker: a kill here leaves an incomplete step, which is set aside.
    checksums.record(directory, directory.parent, prefix=_ITEM)


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
    workdir = epath.Path(workdir)
    # Orbax refuses relative paths (at the first save, deep inside training), and a user's
    # `--workdir=runs/x` is relative to where they launched; URLs such as gs:// count as absolute.
    if not workdir.is_absolute():
      workdir = workdir.absolute()
    self._workdir = workdir
    self._directory = workdir / CHECKPOINT_SUBDIR
    self._save_every = save_every_steps
    self._name_format = _CommittedStepsFormat()
    self._read_only = read_only
    if not read_only:
      self._set_aside_incomplete()
    # Registered up front so a fresh manager can read a step's metadata before any restore.
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    for args_type in (ocp.args.StandardSave, ocp.args.StandardRestore):
      registry.add(_ITEM, args_type, _ChecksummedHandler)
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
      raise CheckpointError(f"This Checkpointer of {self._directory} is read-only.")
    try:
      claim = workdir_claim.held(self._workdir)
      if claim is not None:
        claim.check()  # A run whose workdir was taken over writes nothing more.
      with self._naming_save_failures(step):
        self._check_before_save(step)
      refusal = None
    except (CheckpointError, workdir_claim.WorkdirBusyError) as error:
      refusal = error
    # Orbax's save starts with a barrier of every process: all must enter it, or none.
    refusal = _agreed(f"checkpoint.save.{step}", refusal)
    if isinstance(refusal, _AlreadySaved):
      return False
    if refusal is not None:
      raise refusal
    if not self._writes_held:
      quiet.hold_library_failures()
      self._writes_held = True
    with self._naming_save_failures(step):
      # Due-ness is decided above; force=True keeps orbax from re-deciding with its own policy.
      saved = self._manager.save(step, args=ocp.args.StandardSave(state), force=True)
    if not self._manager.is_saving_in_progress():  # Synchronous: committed already.
      self._settle_writes(reported=False)
    return saved

  def _check_before_save(self, step: int) -> None:
    """Raises what stops this process from saving `step` (_AlreadySaved: skip it)."""
    if step in self._manager.all_steps():
      logging.info("Checkpoint for step %d already exists; not overwriting it.", step)
      raise _AlreadySaved(str(step))
    # Orbax's save replaces an existing directory of the step (it saves with force): look on
    # disk, where another writer (a second Checkpointer, a copy) may have put one since start-up.
    if _has_marker(self.step_dir(step)):
      logging.warning("Checkpoint %s already exists; not overwriting it.", self.step_dir(step))
      raise _AlreadySaved(str(step))
    other = self._foreign_save(step)
    if other is not None:
      raise CheckpointSaveError(
        f"Not saving step {step} under {self._directory}: {other} exists but is not this "
        "run's (another writer is saving into this workdir, or left it half-written). Nothing "
        "was touched. Run one job per workdir, then re-run the same command; the start-up "
        "moves incomplete saves aside."
      )

  def _foreign_save(self, step: int) -> epath.Path | None:
    """A directory of `step` (final name or orbax's temporary one) that this run did not write."""
    if not self._directory.exists():
      return None
    name = self._name_format.build_name(step)
    for entry in self._directory.iterdir():
      if entry.name == name or entry.name.startswith(name + _TMP_TAG):
        return entry
    return None

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
    with quiet.library_failures_held():  # Any error leaving is ours, in one line.
      return self._restore(abstract_state, int(step))

  def _restore(self, abstract_state: PyTree, step: int) -> PyTree:
    damage = None
    if jax.process_index() == 0:  # One reader of the record suffices: the files are shared.
      problem = verify(self.step_dir(step))
      damage = None if problem is None else self._corrupt(step, problem)
    damage = _agreed(f"checkpoint.verify.{step}", damage)
    if damage is not None:
      raise damage
    restored, failure = None, None
    try:
      restored = self._read(step, abstract_state)
    except Exception as error:  # Any failure: classify it and say what to do.
      failure = self._explain_failure(step, abstract_state, error)
      failure.__cause__ = error
    failure = _agreed(f"checkpoint.restore.{step}", failure)
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
      return handler.restore(self.step_dir(step) / _ITEM, args=ocp.args.StandardRestore(target))
    finally:
      handler.close()

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
      except CorruptCheckpointError as error:  # Every process raised it: restore agrees.
        if self._read_only:
          raise
        problem = error.cause
      damaged.append(f"step {step} ({problem})")
      self._set_aside_damaged(step, problem)
    if damaged:
      raise DamagedCheckpointsError(
        f"No checkpoint in {self._directory} is intact, so none was restored: "
        f"{'; '.join(damaged)}. All were moved into {self._directory / DAMAGED_SUBDIR}, nothing "
        "was deleted. Re-run the same command to train from step 0, or copy an intact backup "
        f"of a step into {self._directory} first to resume from it."
      )
    return None

  def _set_aside_damaged(self, step: int, problem: str) -> None:
    """Moves a damaged step to `damaged/`, out of orbax's sight, and tells orbax it is gone."""
    source = self.step_dir(step)
    target = self._directory / DAMAGED_SUBDIR / f"{source.name}-{_utc_stamp()}"
    failure = None
    if jax.process_index() == 0:
      try:
        target.parent.mkdir(parents=True, exist_ok=True)
        source.rename(target)
      except OSError as error:
        failure = CheckpointError(
          f"Checkpoint {source} (step {step}) is damaged ({problem}) but moving it to {target} "
          f"failed: {errors.first_line(error)}. Move it there (or delete it) yourself and re-run "
          "the same command to resume from the next older checkpoint."
        )
      else:
        logging.warning(
          "Checkpoint step %d is damaged (%s): moved %s to %s and falling back to the previous "
          "step. Delete it once you no longer need it.",
          step,
          problem,
          source,
          target,
        )
    failure = _agreed(f"checkpoint.set_aside_damaged.{step}", failure)
    if failure is not None:
      raise failure
    self._manager.reload()

  def wait(self) -> None:
    """Blocks until any asynchronous save has been committed (and re-raises its error)."""
    with self._naming_save_failures(None):
      self._manager.wait_until_finished()
    self._settle_writes(reported=False)

  def close(self) -> None:
    """Completes pending saves and releases orbax's threads."""
    self.wait()
    self._manager.close()

  @contextlib.contextmanager
  def _naming_save_failures(self, step: int | None) -> Iterator[None]:
    """Turns a failed write (often reported by a background save) into CheckpointSaveError."""
    try:
      yield
    except CheckpointError:
      self._settle_writes(reported=True)
      raise
    except Exception as error:  # Orbax and tensorstore raise many types; each is one line.
      self._settle_writes(reported=True)
      what = f"step {step}" if step is not None else "a checkpoint"
      message = self.write_failure(f"Saving {what} under {self._directory}", error)
      raise CheckpointSaveError(message) from error

  def _settle_writes(self, reported: bool) -> None:
    if self._writes_held:
      self._writes_held = False
      quiet.settle_library_failures(reported)

  def write_failure(self, what: str, error: BaseException) -> str:
    """One line for a failed write into the run: `what` (e.g. "Writing RUN/metrics.jsonl"), the
    cause, its fix, and the newest complete checkpoint, from which a re-run resumes."""
    code, reason, where = _os_error(error) or (None, errors.first_line(error), "")
    if where and where not in what:  # The file is named once.
      reason = f"{reason} ({where})"
    try:
      complete = [s for s in sorted(self._manager.all_steps()) if self._is_complete(s)]
      kept = f"step {complete[-1]}" if complete else "none yet"
    except Exception:  # The directory itself may be unreadable now.
      kept = "unknown: the directory cannot be listed"
    return (
      f"{what} failed: {reason}. "
      f"{_WRITE_FIX.get(code, 'Fix the cause')} and re-run the same command; it resumes "
      f"from the newest complete checkpoint ({kept}), which is intact."
    )

  def _is_complete(self, step: int) -> bool:
    return _has_marker(self.step_dir(step))

  def _set_aside_incomplete(self) -> None:
    """Moves step directories of unfinished saves to `incomplete/`, so their steps can be saved.

    Orbax replaces its own `<step>.orbax-checkpoint-tmp` leftovers; a `<step>` without the
    commit marker (the name orbax would write to) it cannot, and a resumed run reaches that step
    again. Process 0 moves; every process waits for it. Nothing moves while another live run
    holds the workdir: its saves in progress look just like unfinished ones.
    """
    busy = False
    if jax.process_index() == 0 and workdir_claim.held(self._workdir) is None:
      try:
        workdir_claim.check_free(self._workdir)
      except workdir_claim.WorkdirBusyError as error:
        busy = True
        logging.warning("Not moving incomplete saves aside: %s", error)
    failure = None
    if jax.process_index() == 0 and self._directory.exists() and not busy:
      try:
        self._move_incomplete()
      except OSError as error:
        failure = CheckpointError(
          f"Moving an unfinished save under {self._directory} aside failed: "
          f"{errors.first_line(error)}. Make the workdir writable (or move the step directory "
          f"without {COMMIT_MARKER} out of it yourself) and re-run the same command."
        )
    failure = _agreed("checkpoint.set_aside_incomplete", failure)
    if failure is not None:
      raise failure

  def _move_incomplete(self) -> None:
    stamp = _utc_stamp()
    for entry in sorted(self._directory.iterdir()):
      name = entry.name
      unfinished_tmp = _TMP_TAG in name
      if not (unfinished_tmp or (name.isdigit() and not _has_marker(entry))):
        continue
      target = self._directory / INCOMPLETE_SUBDIR / f"{name}-{stamp}"
      target.parent.mkdir(parents=True, exist_ok=True)
      entry.rename(target)
      logging.warning(
        "Moved %s aside to %s: its save never finished (no %s), so it is not used for resuming. "
        "Delete it to free the space.",
        entry,
        target,
        COMMIT_MARKER,
      )

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.close()

  def _explain_failure(self, step: int, abstract_state: PyTree, error: Exception) -> Exception:
    """Tells damaged files (drop the step) from a changed model or sharding (keep the files).

    Only calls the files damaged when they fail to read back on their own terms, so a bug in
    the requested state never leads to advice to delete a good checkpoint. Reads on this process
    alone (no collective): `restore` agrees on the verdict afterwards.
    """
    step_dir = self.step_dir(step)
    cause = errors.first_line(error)
    try:
      stored_tree = self._stored_tree(step)
    except Exception as metadata_error:  # Unreadable metadata is damage.
      return self._corrupt(
        step, f"{cause}; reading its metadata failed too: {errors.first_line(metadata_error)}"
      )
    diff = _describe_diff(_shapes_by_path(stored_tree), _shapes_by_path(abstract_state))
    if diff:
      return CheckpointMismatchError(
        f"Checkpoint {step_dir} does not match the state being restored ({diff}). The model, "
        "optimizer or config differs from the run that wrote it: resume with that run's "
        "config, or start in a new workdir. Nothing was deleted."
      )
    try:  # Read every array into host memory, free of the requested dtypes and shardings.
      host_target = jax.tree.map(
        lambda m: np.empty(m.shape, getattr(m, "dtype", None) or np.float32), stored_tree
      )
      self._read(step, host_target)
    except Exception as read_error:
      return self._corrupt(step, errors.first_line(read_error))
    return CheckpointError(
      f"Checkpoint {step_dir} is intact (it reads back in full and matches the state's tree and "
      f"shapes) but cannot be restored as requested: {cause}. Check the dtypes and shardings of "
      "the abstract state against the mesh. Nothing was deleted."
    )

  def _stored_tree(self, step: int) -> PyTree:
    metadata = self._manager.item_metadata(step)
    if metadata is None:
      raise ValueError(f"orbax found no readable item {_ITEM!r}")
    return getattr(metadata, "tree", metadata)

  def _corrupt(self, step: int, cause: str) -> CorruptCheckpointError:
    return damaged_step_error(self.step_dir(step), cause, self.all_steps())


def complete_steps(directory: epath.PathLike) -> list[int]:
  """The complete steps in a `checkpoints/` directory, oldest first; reads only (a Checkpointer
  would move unfinished saves aside), so tools may look at a run that is still training."""
  directory = epath.Path(directory)
  if not directory.is_dir():
    return []
  return sorted(int(d.name) for d in directory.iterdir() if d.name.isdigit() and _has_marker(d))


def steps_to_read(
  workdir: str, steps: Sequence[int | str] | None = None
) -> tuple[epath.Path, list[int]]:
  """(absolute `workdir`, the complete checkpoint steps to read, oldest first), for the tools
  that read a run. `steps`: step numbers (ints or the strings of a --steps flag) and "last", the
  newest complete one; none means every one. No complete checkpoint, a step that is not there or
  an entry that is neither is one UsageError."""
  root = absolute(workdir)
  available = complete_steps(root / CHECKPOINT_SUBDIR)
  if not available:
    raise errors.UsageError(f"--workdir={workdir} has no complete checkpoint to read")
  wanted = set()
  for entry in steps or available:
    text = str(entry).strip()
    if text == "last":
      wanted.add(available[-1])
    elif text.isdigit():
      wanted.add(int(text))
    else:
      raise errors.UsageError(f"--steps: {entry!r} is not a step; give step numbers or last")
  missing = sorted(wanted - set(available))
  if missing:
    raise errors.UsageError(
      f"--workdir={workdir} has no checkpoint of step(s) {missing}; it has {available}"
    )
  return root, sorted(wanted)


def absolute(path: epath.PathLike) -> epath.Path:
  """`path` with a relative local path made absolute (orbax refuses relative ones); a URL such
  as gs://... is already absolute. Call it once, where a user's path enters."""
  path = epath.Path(path)
  return path if path.is_absolute() else path.absolute()


def stored_tree(step_dir: epath.PathLike) -> PyTree:
  """The tree of one complete step directory, with metadata leaves (shape, dtype); reads only.

  Verifies the step's checksums first. Raises CorruptCheckpointError naming the step.
  """
  step_dir = absolute(step_dir)  # Else orbax's refusal of a relative path would read as damage.
  with quiet.library_failures_held():
    return _stored_tree(step_dir)


def _stored_tree(step_dir: epath.Path) -> PyTree:
  problem = verify(step_dir)
  if problem is not None:
    raise damaged_step_error(step_dir, problem, complete_steps(step_dir.parent))
  handler = ocp.PyTreeCheckpointHandler()
  try:
    return handler.metadata(step_dir / _ITEM).tree
  except Exception as error:  # Verified (or older than checksums) yet unreadable: damaged.
    cause = errors.first_line(error)
    raise damaged_step_error(step_dir, cause, complete_steps(step_dir.parent)) from error
  finally:
    handler.close()


def read_on_host(step_dir: epath.PathLike, wanted: PyTree) -> PyTree:
  """The arrays of `wanted` (a subtree of `stored_tree(step_dir)`, which verified the step) as
  numpy, on the host; the rest (e.g. the optimizer state) is not read. Reads only."""
  step_dir = absolute(step_dir)
  with quiet.library_failures_held():
    return _read_on_host(step_dir, wanted)


def _read_on_host(step_dir: epath.Path, wanted: PyTree) -> PyTree:
  handler = ocp.PyTreeCheckpointHandler()
  try:
    target = jax.tree.map(lambda m: np.empty(m.shape, m.dtype), wanted)
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target)
    return handler.restore(
      step_dir / _ITEM,
      args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True),
    )
  except Exception as error:  # The tree came from the step itself: a failure is damage.
    cause = errors.first_line(error)
    raise damaged_step_error(step_dir, cause, complete_steps(step_dir.parent)) from error
  finally:
    handler.close()


def damaged_step_error(
  step_dir: epath.PathLike, cause: str, steps: list[int]
) -> CorruptCheckpointError:
  """The one-line refusal of a damaged step; `steps` are the complete steps beside it."""
  step_dir = epath.Path(step_dir)
  step = int(step_dir.name)
  older = [s for s in steps if s < step]
  target = step_dir.parent / DAMAGED_SUBDIR
  if older:
    fix = (
      f"Move it into {target}/ to use step {older[-1]}, the next older checkpoint (a training "
      "run of this workdir does that by itself when it resumes), or restore it from a copy"
    )
  else:
    fix = "It is the only checkpoint: restore it from a copy, or train afresh"
  return CorruptCheckpointError(
    f"Checkpoint {step_dir} (step {step}) is damaged: {cause}. Nothing was changed. {fix}.",
    step=step,
    cause=cause,
  )


# What `_agreed` can carry from one process to the others, by name.
_AGREED_TYPES = {
  cls.__name__: cls
  for cls in (
    CheckpointError,
    CorruptCheckpointError,
    DamagedCheckpointsError,
    CheckpointMismatchError,
    CheckpointSaveError,
    _AlreadySaved,
    workdir_claim.WorkdirBusyError,
  )
}


def _agreed(name: str, error: Exception | None) -> Exception | None:
  """The failure of the first process (in process order) that had one at `name`, on every
  process, or None where none had; every process must call it, failed or not."""
  if jax.process_count() == 1:
    return error
  mine = ""
  if error is not None:
    mine = json.dumps(
      {
        "type": type(error).__name__,
        "message": str(error),
        "step": getattr(error, "step", None),
        "cause": getattr(error, "cause", ""),
      }
    )
  first = next((value for value in sharding.exchange(name, mine) if value), "")
  if not first or first == mine:
    return error
  found = json.loads(first)
  cls = _AGREED_TYPES.get(found["type"], CheckpointError)
  if issubclass(cls, CorruptCheckpointError):
    return cls(found["message"], step=found["step"], cause=found["cause"])
  return cls(found["message"])


def _utc_stamp() -> str:
  return time.strftime("%Y%m%d-%H%M%S", time.gmtime())


_WRITE_FIX = {
  errno.ENOSPC: "Free disk space (or move the workdir to a larger disk)",
  errno.EDQUOT: "Free space within your disk quota",
  errno.EACCES: "Make the workdir writable",
  errno.EPERM: "Make the workdir writable",
  errno.EROFS: "Use a workdir on a writable file system",
}


def _os_error(error: BaseException) -> tuple[int, str, str] | None:
  """(errno, reason, the path or first line it names) of the OS failure behind `error`, if any.

  Orbax re-raises the OSErrors of its own writes; tensorstore reports its writes as ValueError
  text carrying `[os_error_code='28']`.
  """
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno is not None:
      where = error.filename or str(error).strip().split("\n", 1)[0][:300]
      return error.errno, os.strerror(error.errno), str(where)
    found = re.search(r"os_error_code='(\d+)'", str(error))
    if found:
      code = int(found.group(1))
      path = re.search(r'Failed writing: "([^"]+)"', str(error))
      return code, os.strerror(code), path.group(1) if path else ""
    error = error.__cause__ or error.__context__
  return None


def _key_name(key: Any) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def _shapes_by_path(tree: PyTree) -> dict[str, tuple[int, ...]]:
  """Leaf shapes keyed by a container-agnostic path ("params/vit/w"), as orbax stores trees."""
  shapes = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    shape = getattr(leaf, "shape", None)
    if jax.dtypes.issubdtype(getattr(leaf, "dtype", np.float32), jax.dtypes.prng_key):
      shape = jax.eval_shape(jax.random.key_data, leaf).shape  # Stored as its key data.
    shapes["/".join(_key_name(k) for k in path)] = tuple(np.shape(leaf) if shape is None else shape)
  return shapes


def _describe_diff(stored: dict[str, tuple], wanted: dict[str, tuple], limit: int = 5) -> str:
  """A short account of the paths and shapes that differ, or "" if none do."""
  parts = []
  missing = sorted(wanted.keys() - stored.keys())
  extra = sorted(stored.keys() - wanted.keys())
  reshaped = sorted(
    f"{p}: stored {stored[p]} vs wanted {wanted[p]}"
    for p in wanted.keys() & stored.keys()
    if stored[p] != wanted[p]
  )
  for label, items in (
    ("not in checkpoint", missing),
    ("only in checkpoint", extra),
    ("shape differs", reshaped),
  ):
    if items:
      more = f", ... ({len(items)} in all)" if len(items) > limit else ""
      parts.append(f"{label}: {', '.join(items[:limit])}{more}")
  return "; ".join(parts)
