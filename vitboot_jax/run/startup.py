"""A run's start-up checks, in one place: the config, the workdir, the data.

`main` calls `check` before TensorFlow and JAX load, so a user's mistake is one line within
seconds; a library caller of `train.train_and_evaluate` gets the same checks from it. Nothing is
written before they pass.

A fresh run's sources (`config.init_from`, `config.agent_init_from` alias `teacher=`) are checked
here too, from the files alone: a path that does not exist, or a run of ours without the model it
is to give, is refused, and so is a teacher of other classes or another input size (or, a CNN
teacher, another network). A run that stopped before its end, or a teacher trained with another
agent recipe or on other data, is read as asked (a study may want either), with one warning naming
its step or what differs; `source_warnings` are recorded in the student's config.json.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

import ml_collections
from absl import logging
from etils import epath

from vitboot_jax import configlib
from vitboot_jax.base import errors, library_logs
from vitboot_jax.data import prepare, splits
from vitboot_jax.run import progress, workdir_rules


def check(
  config: ml_collections.ConfigDict,
  workdir: epath.PathLike,
  *,
  single_process: bool,
  num_devices: int | None = None,
  adopt_config: bool = False,
) -> dict[str, Any] | None:
  """Validates `config`, checks `workdir` (free, this config's) and ensures the data.

  `adopt_config`: `workdir` holds checkpoints without config.json and `config` is declared theirs.

  Returns final.json's metrics when `workdir` holds this config's finished run (its results are
  logged: nothing is left to do), else None. Only a single process may download the data.

  Raises:
    errors.UsageError: what the user must change, named with the fix.
  """
  from_data(config)
  configlib.validate(config, num_devices=num_devices)
  final = workdir_rules.check(
    workdir, config, single_process=single_process, adopt_config=adopt_config
  )
  if final is not None:
    logging.info(
      "%s already holds a finished run of this config; nothing to do. %s",
      workdir,
      progress.final_line(final),
    )
    return final
  if not workdir_rules.has_checkpoint(workdir):  # A resume reads none of its sources again.
    for warning in source_warnings(config):
      logging.warning("%s", warning)
  if splits.uses_tensorflow(config):
    _check_tensorflow_installed(config)
  prepare.ensure(config, may_download=single_process)
  if splits.uses_tensorflow(config):
    library_logs.import_tensorflow()  # Before JAX starts: TensorFlow must not take its GPUs.
  return None


def from_data(config: ml_collections.ConfigDict) -> None:
  """What a config for one's own data leaves to the data, settled before anything loads (and
  recorded so in config.json): config.data.val_split="auto" becomes an image folder's "val"
  where ROOT/val exists, else "held_out"; config.data.num_classes=0 becomes the count of the
  image folder's class folders or of the .npz's classes."""
  from vitboot_jax.data import read_folders, read_npz

  root, train_split = config.data.dir, config.data.train_split
  if config.data.get("val_split", "") == "auto":
    has_own = config.data.name == "folder" and root and os.path.isdir(os.path.join(root, "val"))
    config.data.val_split = "val" if has_own else splits.HELD_OUT
  if config.data.num_classes or config.data.name not in splits.ARRAY_SOURCES:
    return
  if not root:
    raise errors.DataError(
      f"config.data.dir is not set (config.data.name={config.data.name!r}); "
      + read_folders.FOLDER_HINT.format(split=train_split)
    )
  if config.data.name == "folder":
    config.data.num_classes = len(read_folders.class_folders(root, train_split, "train_split"))
    return
  arrays = read_npz.read_npz(root, train_split, train_split)
  names = arrays.get("class_names")
  labels = arrays["labels"]
  config.data.num_classes = len(names) if names is not None else int(labels.max(initial=-1)) + 1


def _check_tensorflow_installed(config: ml_collections.ConfigDict) -> None:
  """TensorFlow is the optional [tfdata] extra: its absence is one line naming both ways out."""
  missing = [m for m in ("tensorflow", "tensorflow_datasets") if not importlib.util.find_spec(m)]
  if missing:
    why = (
      f"config.data.name={config.data.name!r} (a tfds dataset)"
      if config.data.name not in splits.ARRAY_SOURCES
      else "config.data.pipeline='tfdata' (the default)"
    )
    raise errors.ConfigError(
      f"{why} needs TensorFlow, which is not installed ({', '.join(missing)}): "
      "pip install -e '.[tfdata]', or train from an image folder or .npz files with "
      "--config.data.pipeline=device"
    )


# Where a run of ours is asked for a model; the flags' names as the user gives them.
_SOURCES = {
  "init_from": ("config.init_from", "ViT", ("vit", "joint", "shared")),
  "agent_init_from": ("teacher= (config.agent_init_from)", "agent", ("agent", "joint")),
}
# What makes a teacher's agent the one this config trains (models/build.py builds the agent from
# `agent` and these `model` fields) and what it learnt from.
AGENT_RECIPE = (
  "agent",
  *(f"model.{name}" for name in ("embed_dim", "depth", "num_heads", "mlp_dim", "patch_size")),
  "image_size",
  "data.name",
  "data.num_classes",
)
# How a student runs its frozen teacher, not what the teacher is: recipe=deit turns it off there.
_NOT_RECIPE = ("agent.drop_path",)
_WEIGHT_SUFFIXES = (".safetensors", ".npz", ".pth", ".pt", ".bin")


def source_warnings(config: ml_collections.ConfigDict) -> list[str]:
  """Checks the runs and files a fresh run of `config` starts from; returns one warning for each
  source that is read but is not what its name suggests (an unfinished run, another recipe).

  Raises:
    errors.ConfigError: a source that does not exist or cannot give its model, with the fix.
  """
  warnings = []
  for field, (flag, model, modes) in _SOURCES.items():
    if field == "agent_init_from" and config.mode == "joint" and config.cnn.get("name"):
      model, modes = "CNN", ("cnn",)  # A CNN teacher in the agent's place.
    path = config.get(field, "")
    if path:
      warnings += _check_source(config, flag, epath.Path(path), model, modes)
  return warnings


def _check_source(
  config: ml_collections.ConfigDict, flag: str, path: epath.Path, model: str, modes: tuple
) -> list[str]:
  named = modes[0] if len(modes) == 1 else f"{', '.join(modes[:-1])} or {modes[-1]}"
  run = f"the workdir of a run of mode {named}"
  give = f"give a .safetensors/.npz/.pth file or {run}" if model == "ViT" else f"give {run}"
  if not path.exists():
    raise errors.ConfigError(f"{flag}={path}: no such file or directory; {give}")
  if not path.is_dir():
    if model == "ViT" and path.suffix.lower() in _WEIGHT_SUFFIXES:
      return []  # A weights file: read as it is.
    raise errors.ConfigError(f"{flag}={path} is a file, not a workdir of ours; {give}")
  root, step = _run_and_step(path)
  if step is None:
    raise errors.ConfigError(
      f"{flag}={path} holds no complete checkpoint ({workdir_rules.CHECKPOINT_SUBDIR}/<step>/"
      f"{workdir_rules.COMMIT_MARKER}); {give} that saved one"
    )
  saved = _read_json(root / workdir_rules.CONFIG_FILE)
  if saved is not None and saved.get("mode") not in modes:
    cnn = (saved.get("cnn") or {}).get("name") if saved.get("mode") == "cnn" else None
    hint = f" (for it as the teacher: teacher_cnn={cnn})" if cnn and model == "agent" else ""
    raise errors.ConfigError(
      f"{flag}={path} is a run of mode {saved.get('mode')!r}, which has no {model}; {give}{hint}"
    )
  if saved is not None and model in ("agent", "CNN"):
    _check_teacher_fits(config, flag, path, saved)
  warnings = []
  final = _read_json(root / workdir_rules.FINAL_FILE)
  last = final.get("step") if final else _planned_steps(saved, root)
  if final is None or step != last:
    of = f" of {last}" if last else ""
    why = "it never finished (no final.json)" if final is None else "not its final step"
    warnings.append(
      f"{flag}={path} is read at step {step}{of}: {why}, so the {model} starts from a part-"
      "trained run; give a finished run to start from the whole of it"
    )
  if model == "agent" and saved is not None:
    differs = _recipe_changes(saved, json.loads(config.to_json_best_effort()))
    if differs:
      warnings.append(
        f"{flag}={path} (step {step}) is a run of another recipe: {', '.join(differs)} (the "
        "teacher's -> this config's); its agent has the shapes this config's needs, so it is "
        "read as it is; give a run of this config with mode=agent for a teacher of this recipe"
      )
  return warnings


def _check_teacher_fits(
  config: ml_collections.ConfigDict, flag: str, path: epath.Path, saved: dict[str, Any]
) -> None:
  """A teacher predicts this config's classes from its images: refused, in one line, when its
  run had other classes or another input size, or (a CNN) is another network."""
  fields = {
    "data.num_classes": ((saved.get("data") or {}).get("num_classes"), config.data.num_classes),
    "image_size": (saved.get("image_size"), config.image_size),
  }
  if config.mode == "joint" and config.cnn.get("name"):
    fields["cnn.name"] = ((saved.get("cnn") or {}).get("name"), config.cnn.name)
  for field, (teacher, student) in fields.items():
    if teacher != student:
      raise errors.ConfigError(
        f"{flag}={path} is a run with {field}={teacher!r} where this config has {student!r}: a "
        "teacher must see the student's images and predict its classes; give a run of this data "
        "at this size" + (" and of this CNN (teacher_cnn=)" if field == "cnn.name" else "")
      )


def _run_and_step(path: epath.Path) -> tuple[epath.Path, int | None]:
  """The run directory behind `path` (a workdir, its checkpoints/ or one step) and the step a
  start reads from it (None: no complete one)."""
  if (path / workdir_rules.COMMIT_MARKER).exists() and path.name.isdigit():
    return path.parent.parent, int(path.name)
  if (
    path.name == workdir_rules.CHECKPOINT_SUBDIR
    and not (path / workdir_rules.CHECKPOINT_SUBDIR).is_dir()
  ):
    path = path.parent
  steps = []
  directory = path / workdir_rules.CHECKPOINT_SUBDIR
  if directory.is_dir():
    steps = [
      int(e.name)
      for e in directory.iterdir()
      if e.name.isdigit() and (e / workdir_rules.COMMIT_MARKER).exists()
    ]
  return path, max(steps) if steps else None


def _planned_steps(saved: dict[str, Any] | None, root: epath.Path) -> int | None:
  """The steps a run was to train (from its config.json and data.json), or None if unknown."""
  data = _read_json(root / workdir_rules.DATA_FILE)
  if saved is None or data is None or "steps_per_epoch" not in data:
    return None
  try:
    return configlib.total_steps(ml_collections.ConfigDict(saved), int(data["steps_per_epoch"]))
  except (AttributeError, KeyError, TypeError, ValueError):
    return None


def _recipe_changes(teacher: dict[str, Any], student: dict[str, Any]) -> list[str]:
  """`field: teacher's -> this config's` for each AGENT_RECIPE field that differs."""

  def leaves(tree: Any, prefix: str) -> dict[str, Any]:
    if not isinstance(tree, dict):
      return {prefix: tree}
    return {k: v for key, sub in tree.items() for k, v in leaves(sub, f"{prefix}.{key}").items()}

  changes = []
  for field in AGENT_RECIPE:
    old, new = teacher, student
    for key in field.split("."):
      old = old.get(key) if isinstance(old, dict) else None
      new = new.get(key) if isinstance(new, dict) else None
    old_leaves, new_leaves = leaves(old, field), leaves(new, field)
    for name in sorted(set(old_leaves) | set(new_leaves)):
      if name not in _NOT_RECIPE and old_leaves.get(name) != new_leaves.get(name):
        changes.append(f"{name}: {old_leaves.get(name)!r} -> {new_leaves.get(name)!r}")
  return changes


def _read_json(path: epath.Path) -> dict[str, Any] | None:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None
