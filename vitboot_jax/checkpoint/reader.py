"""Reading a run's checkpoints without touching them: the path of the tools and of `init_from`.

Nothing here creates, moves or deletes a file, so a tool may read a run that is still training.
Each step is verified against its checksums first (checksums.py); a damaged step, one whose
record is gone included, is refused by name (CorruptCheckpointError, exit 2), never replaced by
an older one. The tools' `--steps` flag (numbers or `last`) is resolved here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from vitboot_jax.base import errors, library_logs
from vitboot_jax.checkpoint.checksums import verify
from vitboot_jax.checkpoint.failures import damaged_step_error
from vitboot_jax.checkpoint.step_dirs import ITEM, absolute, complete_steps
from vitboot_jax.run.workdir_rules import CHECKPOINT_SUBDIR

PyTree = Any


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


def stored_tree(step_dir: epath.PathLike) -> PyTree:
  """The tree of one complete step directory, with metadata leaves (shape, dtype); reads only.

  Verifies the step's checksums first. Raises CorruptCheckpointError naming the step.
  """
  step_dir = absolute(step_dir)  # Else orbax's refusal of a relative path would read as damage.
  with library_logs.library_failures_held():
    problem = verify(step_dir)
    if problem is not None:
      raise damaged_step_error(step_dir, problem, complete_steps(step_dir.parent))
    handler = ocp.PyTreeCheckpointHandler()
    try:
      return handler.metadata(step_dir / ITEM).tree
    except Exception as error:  # Verified (or older than checksums) yet unreadable: damaged.
      cause = errors.first_line(error)
      raise damaged_step_error(step_dir, cause, complete_steps(step_dir.parent)) from error
    finally:
      handler.close()


def read_on_host(step_dir: epath.PathLike, wanted: PyTree) -> PyTree:
  """The arrays of `wanted` (a subtree of `stored_tree(step_dir)`, which verified the step) as
  numpy, on the host; the rest (e.g. the optimizer state) is not read. Reads only."""
  step_dir = absolute(step_dir)
  handler = ocp.PyTreeCheckpointHandler()
  with library_logs.library_failures_held():
    try:
      target = jax.tree.map(lambda m: np.empty(m.shape, m.dtype), wanted)
      restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target)
      return handler.restore(
        step_dir / ITEM,
        args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True),
      )
    except Exception as error:  # The tree came from the step itself: a failure is damage.
      cause = errors.first_line(error)
      raise damaged_step_error(step_dir, cause, complete_steps(step_dir.parent)) from error
    finally:
      handler.close()
