"""The rules of a run's workdir, checked before anything is written to it.

A workdir belongs to the config of the run that saved a checkpoint (or finished) in it: another
config is refused, whether that run is finished or not. A workdir without a checkpoint (a run that
failed before its first save) holds nothing worth keeping, so it accepts any config. Checkpoints
without config.json (deleted, a partial copy) are refused, never resumed with whatever config the
command gives: `--adopt_config` (main) declares the command's config theirs. Nothing is created
before these checks and the data check pass, so a mistake leaves no directory behind.

One run at a time: a workdir held by a live run (workdir_claim.py) is refused. A run records what
it trains on in data.json beside config.json; resuming a checkpoint on other data (files added or
deleted, another dataset version) is refused, since its epochs and schedule would silently change.
"""

from __future__ import annotations

import errno
import json
import os
from typing import Any

import ml_collections
from etils import epath

from vitboot_jax import configlib
from vitboot_jax.base import errors
from vitboot_jax.run import workdir_claim

CONFIG_FILE = "config.json"
DATA_FILE = "data.json"
FINAL_FILE = "final.json"
# The checkpoint layout, here so it loads before JAX and orbax; the checkpoint modules import it.
CHECKPOINT_SUBDIR = "checkpoints"
# Written by orbax 0.12 into every step directory at commit, in both atomicity modes (a test
# checks it against orbax's own name).
COMMIT_MARKER = "commit_success.txt"
# Under CHECKPOINT_SUBDIR: where step directories of saves that never finished are moved, and
# where damaged steps are, out of orbax's sight (never deleted).
INCOMPLETE_SUBDIR = "incomplete"
DAMAGED_SUBDIR = "damaged"
# Fields that may change between runs without changing the experiment.
VOLATILE_FIELDS = frozenset(
  {
    "log_every_steps",
    "log_hint_shares",  # A diagnostic: the update is the same with it on or off.
    "checkpoint_every_steps",
    "keep_checkpoints",
    "eval_every_steps",
    "eval_every_epochs",
    "steps_per_call",  # Speed only; also absent from the config.json of older runs.
    "source_warnings",  # A record of what a fresh run started from, not a switch.
  }
)
# config.json's record of startup.source_warnings: what a fresh run's sources were.
SOURCE_WARNINGS = "source_warnings"


def has_checkpoint(workdir: epath.PathLike) -> bool:
  """Whether `workdir` holds a complete checkpoint (a step directory with its commit marker)."""
  directory = epath.Path(workdir) / CHECKPOINT_SUBDIR
  if not directory.is_dir():
    return False
  return any(e.name.isdigit() and (e / COMMIT_MARKER).exists() for e in directory.iterdir())


def saved_config(workdir: epath.PathLike) -> dict[str, Any]:
  """config.json of `workdir` as saved ({} where there is none or it cannot be read)."""
  try:
    return json.loads((epath.Path(workdir) / CONFIG_FILE).read_text())
  except (OSError, ValueError):
    return {}


def saved_data(workdir: epath.PathLike) -> dict[str, Any]:
  """data.json of `workdir`: what its run trained on ({} where there is none or it cannot be
  read)."""
  try:
    return json.loads((epath.Path(workdir) / DATA_FILE).read_text())
  except (OSError, ValueError):
    return {}


def read_config(workdir: epath.PathLike) -> ml_collections.ConfigDict:
  """The config a run saved in `workdir` (config.json): what tools reading the run work from."""
  config_file = epath.Path(workdir) / CONFIG_FILE
  if not config_file.exists():
    raise errors.WorkdirError(
      f"--workdir={workdir} has no {CONFIG_FILE}: give the workdir of a training run"
    )
  saved = json.loads(config_file.read_text())
  return ml_collections.ConfigDict(_with_defaults(saved, configlib.base_config().to_dict()))


def _with_defaults(saved: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
  """`saved` with every field it lacks set to its default: a run written before a field existed
  ran with the default's behaviour (the rule changed_fields relies on too)."""
  merged = dict(saved)
  for key, default in defaults.items():
    if key not in merged:
      merged[key] = default
    elif isinstance(merged[key], dict) and isinstance(default, dict):
      merged[key] = _with_defaults(merged[key], default)
  return merged


_MAX_CHANGES_SHOWN = 6
_UNSET = object()


def _added_default(defaults: dict[str, Any], path: str, new: Any) -> bool:
  """Whether `path` is a field a newer version added, holding its default in `defaults` (the
  behaviour of the version that wrote the config.json, which lacks the field)."""
  default: Any = defaults
  for key in path.split("."):
    if not isinstance(default, dict) or key not in default:
      return False
    default = default[key]
  return default == new


def changed_fields(saved: dict[str, Any], config: ml_collections.ConfigDict) -> list[str]:
  """`field: saved -> current` for every config leaf that differs from a saved config.json
  (e.g. `optim.lr: 0.001 -> 0.002`), volatile fields aside, in field order. A field the saved
  config lacks counts only if it differs from its default: new versions add fields whose default
  is the old behaviour, and an older run must still resume."""
  current = json.loads(config.to_json_best_effort())
  defaults = json.loads(configlib.base_config().to_json_best_effort())

  def diff(old: Any, new: Any, prefix: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
      keys = sorted(set(old) | set(new))
      return [
        change
        for k in keys
        if f"{prefix}{k}" not in VOLATILE_FIELDS
        for change in diff(old.get(k, _UNSET), new.get(k, _UNSET), f"{prefix}{k}.")
      ]
    if old == new or (old is _UNSET and _added_default(defaults, prefix[:-1], new)):
      return []
    show = lambda v: "(unset)" if v is _UNSET else repr(v)
    return [f"{prefix[:-1]}: {show(old)} -> {show(new)}"]

  return diff(saved, current, "")


def check(
  workdir: epath.PathLike,
  config: ml_collections.ConfigDict,
  *,
  single_process: bool = True,
  adopt_config: bool = False,
) -> dict[str, Any] | None:
  """Checks that `config` may run in `workdir`; writes nothing.

  A multi-process run (`single_process=False`) leaves the claim to process 0's atomic
  workdir_claim.acquire_for_run: its own claim.json would look like another run to the others.
  A run with checkpoints but no config.json (deleted, or a partial copy) is refused unless
  `adopt_config`: the user then says that `config` is the one its checkpoints were trained with.

  Returns:
    final.json's metrics when `workdir` holds this config's finished run (nothing to do), else
    None (a fresh or resumable run).

  Raises:
    errors.WorkdirError: `workdir` holds a run of another config, is in use by a live run, or
      cannot be written.
  """
  workdir = epath.Path(workdir)
  if single_process:
    workdir_claim.check_free(workdir)
  final_path = workdir / FINAL_FILE
  finished = final_path.exists()
  if finished or has_checkpoint(workdir):
    config_path = workdir / CONFIG_FILE
    if not config_path.exists() and not adopt_config:
      raise errors.WorkdirError(
        f"--workdir={workdir} holds a {'finished' if finished else 'saved'} run but no "
        f"{CONFIG_FILE}, so the config it was trained with is unknown; if this command's config "
        f"is that run's, add --adopt_config to record it as {config_path} and "
        f"{'read its results' if finished else 'resume'}, else use a new --workdir"
      )
    if config_path.exists():
      changed = changed_fields(json.loads(config_path.read_text()), config)
      if changed:
        state = "a finished" if finished else "an unfinished"
        more = len(changed) - _MAX_CHANGES_SHOWN
        shown = ", ".join(changed[:_MAX_CHANGES_SHOWN]) + (f", and {more} more" if more > 0 else "")
        raise errors.WorkdirError(
          f"--workdir={workdir} holds {state} run of a different config ({shown}); use a new "
          f"--workdir, or that run's config to "
          f"{'read its results' if finished else 'resume it'} ({config_path})"
        )
  if finished:
    return json.loads(final_path.read_text())
  _check_writable(workdir)
  return None


def _describe_data_change(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
  changes = []
  # "validation": recorded only by runs with a validation split.
  for key in ("name", "version", "num_train_examples", "steps_per_epoch", "validation"):
    if saved.get(key) != current.get(key):
      changes.append(f"{key.replace('_', ' ')} {saved.get(key)} -> {current.get(key)}")
  if saved.get("class_names") != current.get("class_names"):
    changes.append("class names differ")
  saved_splits, splits = saved.get("splits", {}), current.get("splits", {})
  for split in sorted(set(saved_splits) | set(splits)):
    old, new = saved_splits.get(split, {}), splits.get(split, {})
    if old.get("examples") != new.get("examples"):
      changes.append(f"{split!r} examples {old.get('examples')} -> {new.get('examples')}")
    elif old.get("files_sha256") != new.get("files_sha256"):
      changes.append(f"{split!r} files differ (same count: renamed, replaced or resized)")
    elif old.get("arrays_sha256") != new.get("arrays_sha256"):
      changes.append(f"{split!r} images or labels differ (same count)")
  return changes


def check_data(workdir: epath.PathLike, fingerprint: dict[str, Any]) -> None:
  """Refuses to resume `workdir`'s checkpoint on data other than what its run recorded.

  Raises:
    errors.WorkdirError: The recorded data.json differs from `fingerprint` and a checkpoint
      exists (without one, the run starts afresh and records the new data).
  """
  workdir = epath.Path(workdir)
  path = workdir / DATA_FILE
  if not path.exists() or not has_checkpoint(workdir):
    return
  changes = _describe_data_change(json.loads(path.read_text()), fingerprint)
  if changes:
    raise errors.WorkdirError(
      f"--workdir={workdir} holds a run trained on other data than config.data now gives "
      f"({'; '.join(changes)}; recorded in {path}); restore that data to resume, or start afresh "
      "in a new --workdir"
    )


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
