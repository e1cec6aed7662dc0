"""The rules of a run's workdir, checked before anything is written to it.

A workdir belongs to the config of the run that saved a checkpoint (or finished) in it: another
config is refused, whether that run is finished or not. A workdir without a checkpoint (a run that
failed before its first save) holds nothing worth keeping, so it accepts any config. Nothing is
created before these checks and the data check pass, so a mistake leaves no directory behind.
"""

from __future__ import annotations

import errno
import json
import os
from typing import Any

import ml_collections
from etils import epath

from vitboot_jax import errors

CONFIG_FILE = "config.json"
FINAL_FILE = "final.json"
# The checkpoint layout, here so it loads before JAX and orbax; checkpoint.py imports it.
CHECKPOINT_SUBDIR = "checkpoints"
# Written by orbax 0.12 into every step directory at commit, in both atomicity modes.
COMMIT_MARKER = "commit_success.txt"
# Fields that may change between runs without changing the experiment.
VOLATILE_FIELDS = frozenset(
  {
    "log_every_steps",
    "checkpoint_every_steps",
    "keep_checkpoints",
    "eval_every_steps",
    "eval_every_epochs",
    "steps_per_call",  # Speed only; also absent from the config.json of older runs.
  }
)


def has_checkpoint(workdir: epath.PathLike) -> bool:
  """Whether `workdir` holds a complete checkpoint (a step directory with its commit marker)."""
  directory = epath.Path(workdir) / CHECKPOINT_SUBDIR
  if not directory.is_dir():
    return False
  return any(e.name.isdigit() and (e / COMMIT_MARKER).exists() for e in directory.iterdir())


def changed_fields(saved: dict[str, Any], config: ml_collections.ConfigDict) -> list[str]:
  """Top-level config fields that differ from a saved config.json, volatile ones aside."""
  current = json.loads(config.to_json_best_effort())
  keys = set(saved) | set(current)
  return sorted(k for k in keys - VOLATILE_FIELDS if saved.get(k) != current.get(k))


def check(workdir: epath.PathLike, config: ml_collections.ConfigDict) -> dict[str, Any] | None:
  """Checks that `config` may run in `workdir`; writes nothing.

  Returns:
    final.json's metrics when `workdir` holds this config's finished run (nothing to do), else
    None (a fresh or resumable run).

  Raises:
    errors.WorkdirError: `workdir` holds a run of another config, or cannot be written.
  """
  workdir = epath.Path(workdir)
  final_path = workdir / FINAL_FILE
  finished = final_path.exists()
  if finished or has_checkpoint(workdir):
    config_path = workdir / CONFIG_FILE
    if config_path.exists():
      changed = changed_fields(json.loads(config_path.read_text()), config)
      if changed:
        state = "finished" if finished else "unfinished"
        raise errors.WorkdirError(
          f"--workdir={workdir} holds a {state} run of a different config (fields: "
          f"{', '.join(changed)}); use a new --workdir, or that run's config to "
          f"{'read its results' if finished else 'resume it'} ({config_path})"
        )
  if finished:
    return json.loads(final_path.read_text())
  _check_writable(workdir)
  return None


def _check_writable(workdir: epath.Path) -> None:
  """Fails if the workdir (or, while it does not exist, its nearest existing parent) cannot be
  written; object stores (gs://...) are left to their own errors."""
  path = os.fspath(workdir)
  if "://" in path:
    return
  path = os.path.abspath(path)
  existing = path
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise errors.WorkdirError(
      f"--workdir={workdir} cannot be created: {existing} is a file; choose another directory"
    )
  if not os.access(existing, os.W_OK | os.X_OK):
    raise errors.WorkdirError(
      f"--workdir={workdir} cannot be written: {os.strerror(errno.EACCES)} on {existing}; "
      "choose a directory you can write to"
    )
