"""The step directories under `<workdir>/checkpoints/`: which count, and moving the others aside.

Completeness. Orbax 0.12 writes a step into `<step>.orbax-checkpoint-tmp` and, once every array
is on disk, writes `commit_success.txt` into it and renames it to `<step>` (atomic on POSIX). On
object stores (gs://) it writes in place and the marker alone marks the commit. So a step counts
only if its directory has the final name AND holds `commit_success.txt`; both are checked through
the step-name format handed to orbax, so orbax's own step list, its keep-last-K deletion and its
restore never see a save that a kill cut short.

Set aside, never deleted. A step directory without the marker would block the resumed run from
saving that step again, so at start-up, and only then, it is moved into
`checkpoints/incomplete/<name>-<UTC time>` (logged). The run holds the workdir's claim
(workdir_claim.py) by then, so nothing moved can be another live run's save in progress; if
another run holds the claim, nothing is moved. A damaged step goes to
`checkpoints/damaged/<step>-<UTC time>`. Process 0 moves; every process learns the outcome.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from vitboot_jax.base import errors
from vitboot_jax.checkpoint.failures import CheckpointError, agreed
from vitboot_jax.run import workdir_claim
from vitboot_jax.run.workdir_rules import COMMIT_MARKER, DAMAGED_SUBDIR, INCOMPLETE_SUBDIR

# The item name the Checkpointer registers its handler under: the step's `default/` directory.
ITEM = "default"


@dataclasses.dataclass(frozen=True)
class CommittedStepsFormat:
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
      if has_marker(metadata.path):
        yield metadata
      else:
        logging.warning(
          "Ignoring checkpoint %s: it has no %s, so its save never finished.",
          metadata.path,
          COMMIT_MARKER,
        )

  def find_step(self, base_path: epath.PathLike, step: int) -> Any:
    metadata = self.base.find_step(base_path, step)
    if not has_marker(metadata.path):
      raise ValueError(f"Checkpoint {metadata.path} has no {COMMIT_MARKER}; it is incomplete.")
    return metadata


def has_marker(step_dir: epath.PathLike) -> bool:
  return (epath.Path(step_dir) / COMMIT_MARKER).exists()


def complete_steps(directory: epath.PathLike) -> list[int]:
  """The complete steps in a `checkpoints/` directory, oldest first; reads only (a Checkpointer
  would move unfinished saves aside), so tools may look at a run that is still training."""
  directory = epath.Path(directory)
  if not directory.is_dir():
    return []
  return sorted(int(d.name) for d in directory.iterdir() if d.name.isdigit() and has_marker(d))


def absolute(path: epath.PathLike) -> epath.Path:
  """`path` with a relative local path made absolute (orbax refuses relative ones); a URL such
  as gs://... is already absolute. Call it once, where a user's path enters."""
  path = epath.Path(path)
  return path if path.is_absolute() else path.absolute()


def foreign_save(directory: epath.Path, name: str) -> epath.Path | None:
  """A directory of step `name` (its final name or orbax's temporary one) in `directory`."""
  if not directory.exists():
    return None
  for entry in directory.iterdir():
    if entry.name == name or entry.name.startswith(name + ocp.step.TMP_DIR_SUFFIX):
      return entry
  return None


def set_aside_incomplete(workdir: epath.Path, directory: epath.Path) -> None:
  """Moves step directories of unfinished saves to `incomplete/`, so their steps can be saved.

  Orbax replaces its own `<step>.orbax-checkpoint-tmp` leftovers; a `<step>` without the
  commit marker (the name orbax would write to) it cannot, and a resumed run reaches that step
  again. Every process calls it. Nothing moves while another live run holds the workdir: its
  saves in progress look just like unfinished ones.
  """
  busy = False
  if jax.process_index() == 0 and workdir_claim.held(workdir) is None:
    try:
      workdir_claim.check_free(workdir)
    except workdir_claim.WorkdirBusyError as error:
      busy = True
      logging.warning("Not moving incomplete saves aside: %s", error)
  failure = None
  if jax.process_index() == 0 and directory.exists() and not busy:
    try:
      _move_incomplete(directory)
    except OSError as error:
      failure = CheckpointError(
        f"Moving an unfinished save under {directory} aside failed: "
        f"{errors.first_line(error)}. Make the workdir writable (or move the step directory "
        f"without {COMMIT_MARKER} out of it yourself) and re-run the same command."
      )
  failure = agreed("checkpoint.set_aside_incomplete", failure)
  if failure is not None:
    raise failure


def _move_incomplete(directory: epath.Path) -> None:
  stamp = _utc_stamp()
  for entry in sorted(directory.iterdir()):
    name = entry.name
    unfinished_tmp = ocp.step.TMP_DIR_SUFFIX in name
    if not (unfinished_tmp or (name.isdigit() and not has_marker(entry))):
      continue
    target = directory / INCOMPLETE_SUBDIR / f"{name}-{stamp}"
    target.parent.mkdir(parents=True, exist_ok=True)
    entry.rename(target)
    logging.warning(
      "Moved %s aside to %s: its save never finished (no %s), so it is not used for resuming. "
      "Delete it to free the space.",
      entry,
      target,
      COMMIT_MARKER,
    )


def set_aside_damaged(step_dir: epath.Path, problem: str) -> None:
  """Moves a damaged step to `damaged/` with one warning; every process calls it."""
  step = int(step_dir.name)
  target = step_dir.parent / DAMAGED_SUBDIR / f"{step_dir.name}-{_utc_stamp()}"
  failure = None
  if jax.process_index() == 0:
    try:
      target.parent.mkdir(parents=True, exist_ok=True)
      step_dir.rename(target)
    except OSError as error:
      failure = CheckpointError(
        f"Checkpoint {step_dir} (step {step}) is damaged ({problem}) but moving it to {target} "
        f"failed: {errors.first_line(error)}. Move it there (or delete it) yourself and re-run "
        "the same command to resume from the next older checkpoint."
      )
    else:
      logging.warning(
        "Checkpoint step %d is damaged (%s): moved %s to %s and falling back to the previous "
        "step. Delete it once you no longer need it.",
        step,
        problem,
        step_dir,
        target,
      )
  failure = agreed(f"checkpoint.set_aside_damaged.{step}", failure)
  if failure is not None:
    raise failure


def _utc_stamp() -> str:
  return time.strftime("%Y%m%d-%H%M%S", time.gmtime())
