"""A run's start-up checks, in one place: the config, the workdir, the data.

`main` calls `check` before TensorFlow and JAX load, so a user's mistake is one line within
seconds; a library caller of `train.train_and_evaluate` gets the same checks from it. Nothing is
written before they pass.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import ml_collections
from absl import logging
from etils import epath

from vitboot_jax import configlib, errors, progress, quiet, workdirs
from vitboot_jax.data import prepare, splits


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
  configlib.validate(config, num_devices=num_devices)
  final = workdirs.check(workdir, config, single_process=single_process, adopt_config=adopt_config)
  if final is not None:
    logging.info(
      "%s already holds a finished run of this config; nothing to do. %s",
      workdir,
      progress.final_line(final),
    )
    return final
  if splits.uses_tensorflow(config):
    _check_tensorflow_installed(config)
  prepare.ensure(config, may_download=single_process)
  if splits.uses_tensorflow(config):
    quiet.import_tensorflow()  # Before JAX starts: TensorFlow must not take its GPUs.
  return None


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
