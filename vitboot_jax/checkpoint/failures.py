"""A checkpoint's failures, each said in one line and the same on every process.

The exceptions the Checkpointer and the readers raise, and their lines: a damaged step (and the
step to fall back to), no intact step at all, a state that differs from the checkpoint (the paths
and shapes that differ), an intact step that cannot be restored as asked, and a failed write (the
OS cause behind orbax's and tensorstore's errors, its fix, the newest complete step). `agreed`
hands every process of a run the failure of the first process that had one, so all raise the same
line together and none enters a collective that another has left.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import jax
import numpy as np
from etils import epath

from vitboot_jax import sharding
from vitboot_jax.base import errors, files
from vitboot_jax.run import workdir_claim
from vitboot_jax.run.workdir_rules import DAMAGED_SUBDIR

PyTree = Any


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


class AlreadySaved(CheckpointError):
  """The step is on disk already: every process skips its save (not a failure)."""


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


def no_intact_step_error(directory: epath.Path, damaged: list[str]) -> DamagedCheckpointsError:
  """Every step of `directory` was damaged (`damaged`: "step N (cause)") and moved aside."""
  return DamagedCheckpointsError(
    f"No checkpoint in {directory} is intact, so none was restored: {'; '.join(damaged)}. All "
    f"were moved into {directory / DAMAGED_SUBDIR}, nothing was deleted. Re-run the same "
    f"command to train from step 0, or copy an intact backup of a step into {directory} first "
    "to resume from it."
  )


def mismatch_error(
  step_dir: epath.Path, stored_tree: PyTree, abstract_state: PyTree
) -> CheckpointMismatchError | None:
  """The refusal of a state whose tree or shapes differ from the step's, or None if they agree."""
  diff = _describe_diff(_shapes_by_path(stored_tree), _shapes_by_path(abstract_state))
  if not diff:
    return None
  return CheckpointMismatchError(
    f"Checkpoint {step_dir} does not match the state being restored ({diff}). The model, "
    "optimizer or config differs from the run that wrote it: resume with that run's "
    "config, or start in a new workdir. Nothing was deleted."
  )


def unrestorable_error(step_dir: epath.Path, cause: str) -> CheckpointError:
  """An intact step that fails to restore into the requested dtypes and shardings."""
  return CheckpointError(
    f"Checkpoint {step_dir} is intact (it reads back in full and matches the state's tree and "
    f"shapes) but cannot be restored as requested: {cause}. Check the dtypes and shardings of "
    "the abstract state against the mesh. Nothing was deleted."
  )


def foreign_save_error(step: int, directory: epath.Path, other: epath.Path) -> CheckpointSaveError:
  """A save refused because `other`, a directory of the same step, is not this run's."""
  return CheckpointSaveError(
    f"Not saving step {step} under {directory}: {other} exists but is not this run's (another "
    "writer is saving into this workdir, or left it half-written). Nothing was touched. Run one "
    "job per workdir, then re-run the same command; the start-up moves incomplete saves aside."
  )


def write_failure(what: str, error: BaseException, complete: list[int] | None) -> str:
  """One line for a failed write into a run: `what` (e.g. "Writing RUN/metrics.jsonl"), the
  cause, its fix, and the newest of the `complete` steps (None: they cannot be listed), from
  which a re-run resumes."""
  code, reason, where = _os_error(error) or (None, errors.first_line(error), "")
  if where and where not in what:  # The file is named once.
    reason = f"{reason} ({where})"
  if complete is None:
    kept = "unknown: the directory cannot be listed"
  else:
    kept = f"step {complete[-1]}" if complete else "none yet"
  return (
    f"{what} failed: {reason}. "
    f"{files.WRITE_FIXES.get(code, 'Fix the cause')} and re-run the same command; it resumes "
    f"from the newest complete checkpoint ({kept}), which is intact."
  )


# What `agreed` can carry from one process to the others, by name.
_AGREED_TYPES = {
  cls.__name__: cls
  for cls in (
    CheckpointError,
    CorruptCheckpointError,
    DamagedCheckpointsError,
    CheckpointMismatchError,
    CheckpointSaveError,
    AlreadySaved,
    workdir_claim.WorkdirBusyError,
  )
}


def agreed(name: str, error: Exception | None) -> Exception | None:
  """The failure of the first process (in process order) that had one at `name`, on every
  process, or None where none had; every process must call it, failed or not."""
  return next((found for found in each_process(name, error) if found is not None), None)


def each_process(name: str, error: Exception | None) -> list[Exception | None]:
  """Every process's failure at `name` (None: it had none), in process order, on every process
  (this process's own as it is); every process must call it, failed or not."""
  if jax.process_count() == 1:
    return [error]
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
  # A value equal to this process's own is its own error, as raised (its cause chain kept).
  values = sharding.exchange(name, mine)
  return [error if value == mine else _decode(value) if value else None for value in values]


def _decode(value: str) -> Exception:
  found = json.loads(value)
  cls = _AGREED_TYPES.get(found["type"], CheckpointError)
  if issubclass(cls, CorruptCheckpointError):
    return cls(found["message"], step=found["step"], cause=found["cause"])
  return cls(found["message"])


def unconfirmed_damage_error(step_dir: epath.Path, process: int, cause: str) -> CheckpointError:
  """A step that another process cannot read while process 0, which would move it, reads it."""
  step_dir = epath.Path(step_dir)
  return CheckpointError(
    f"Checkpoint {step_dir} (step {step_dir.name}) cannot be read on process {process} ({cause}), "
    "but process 0 reads it intact (its files pass the checks of its save), so it is not "
    f"damaged: process {process}'s view of the files may lag behind (a network file system) or "
    "its read failed for a moment. Nothing was moved. Re-run the same command; if it fails "
    "again, check that every host sees the same files."
  )


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
