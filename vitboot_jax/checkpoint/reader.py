"""Reading a run's checkpoints without touching them: the path of the tools and of `init_from`.

Nothing here creates, moves or deletes a file, so a tool may read a run that is still training.
Each step is verified against its checksums first (checksums.py); a damaged step, one whose
record is gone included, is refused by name (CorruptCheckpointError, exit 2), never replaced by
an older one. The tools' `--steps` flag (numbers or `last`) is resolved here too, and `read_run`
gives the tools that use a run's models (export, predict) its config and weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from vitboot_jax.base import errors, library_logs
from vitboot_jax.checkpoint.checksums import verify
from vitboot_jax.checkpoint.failures import damaged_step_error
from vitboot_jax.checkpoint.step_dirs import ITEM, absolute, complete_steps
from vitboot_jax.run import workdir_rules
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


@dataclasses.dataclass
class Run:
  """What a run's workdir holds that a tool using its models needs: its config and one
  checkpoint's weights."""

  config: ml_collections.ConfigDict
  step: int
  params: dict[str, Any]  # {"vit": ..., "agent": ..., "cnn": ...} as numpy: the models read.
  batch_stats: dict[str, Any]  # {"agent": ...}: those models' BatchNorm statistics.
  left_out: list[str]  # Parameter subtrees not read that a user may miss (DrLoc heads).


def read_run(
  workdir: str, step: int | None = None, models: Sequence[str] = ("vit", "agent")
) -> Run:
  """The config and the weights of `models` (those the run has) of `workdir`'s newest complete
  step (or `step`); the optimizer state is not read. No complete checkpoint is a WorkdirError."""
  root = absolute(workdir)  # Orbax reads absolute paths only; users type relative.
  config = workdir_rules.read_config(root)
  directory = root / CHECKPOINT_SUBDIR
  steps = complete_steps(directory)
  if not steps:
    raise errors.WorkdirError(
      f"--workdir={workdir} holds no complete checkpoint ({directory}/<step>/"
      f"{workdir_rules.COMMIT_MARKER}); wait until the run has saved one"
    )
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise errors.WorkdirError(f"--step={step} is not a complete checkpoint of {workdir}: {steps}")
  step_dir = directory / str(step)
  stored = stored_tree(step_dir)  # Verifies the step: a damaged one is refused.
  wanted = {
    "params": {k: v for k, v in stored["params"].items() if k in models},
    "batch_stats": {k: v for k, v in (stored.get("batch_stats") or {}).items() if k in models},
  }
  restored = read_on_host(step_dir, wanted) if wanted["params"] else wanted
  left_out = sorted(k for k in stored["params"] if k.startswith("drloc_"))
  return Run(config, step, restored["params"], restored.get("batch_stats") or {}, left_out)
