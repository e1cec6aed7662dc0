"""The workdir's record of the data a run trains on (data.json), so a resume on other data is
refused (workdirs.check_data compares it), and the class names the tools that use a trained
model read from it."""

from __future__ import annotations

import hashlib
from typing import Any

import ml_collections
import numpy as np

from vitboot_jax.base import errors
from vitboot_jax.data import read_folders, read_npz, splits


def data_fingerprint(config: ml_collections.ConfigDict, info: splits.DatasetInfo) -> dict[str, Any]:
  """What a run trains on, recorded in its workdir so a resume on other data is refused.

  Per split, its example count and: for an image folder, a sha256 of the file list (paths
  relative to the split, and sizes); for an .npz, a sha256 of its images' and labels' bytes
  (a fraction of a second at CIFAR scale, docs/performance.md; the file's own bytes change with
  every write's zip timestamps); for a tfds dataset, the dataset's version (read through tfds,
  hence TensorFlow, which a tfds run has). All: class names, training examples and steps per
  epoch.
  """
  name, train_split = config.data.name, config.data.train_split
  val_split = splits.validation_split(config)
  named = (train_split, config.data.eval_split, *([val_split] if val_split else []))
  split_names = list(dict.fromkeys(named))
  record: dict[str, Any] = {"name": name}
  if name == "folder":
    classes = tuple(read_folders.class_folders(config.data.dir, train_split, "train_split"))
    per_split = {}
    for split in split_names:
      paths, _ = read_folders.list_folder(
        config.data.dir, split, splits.split_field(split, train_split), classes
      )
      digest = read_folders.FILES_DIGEST[(config.data.dir, split, classes)]
      per_split[split] = {"examples": len(paths), "files_sha256": digest}
  elif name == "npz":
    per_split = {}
    for split in split_names:
      arrays = read_npz.read_npz(config.data.dir, split, train_split)
      digest = hashlib.sha256()
      for key in ("images", "labels"):
        digest.update(f"{key}{arrays[key].dtype}{arrays[key].shape}".encode())
        digest.update(np.ascontiguousarray(arrays[key]).data)
      per_split[split] = {"examples": len(arrays["labels"]), "arrays_sha256": digest.hexdigest()}
  else:
    from vitboot_jax.data import tfdata_sources  # tfds reads through TensorFlow.

    record["version"], counts = tfdata_sources.tfds_record(config)
    per_split = {split: {"examples": count} for split, count in counts.items()}
  record.update(
    splits=per_split,
    class_names=list(info.class_names),
    num_train_examples=info.num_train_examples,
    steps_per_epoch=info.steps_per_epoch,
    summary=splits.describe(config, info),
  )
  if val_split is not None:
    record["validation"] = {
      "split": val_split,
      "held_out": splits.holds_out(config),
      "examples": info.num_val_examples,
    }
    if splits.holds_out(config):
      record["validation"]["val_fraction"] = config.data.val_fraction
  return record


def class_names(config: ml_collections.ConfigDict, record: dict[str, Any]) -> tuple[str, ...]:
  """The class names of a run by label index: its data.json `record`'s, else (a workdir without
  one, e.g. a copied checkpoint) those config.data's source gives now; DataError without either."""
  if record.get("class_names"):
    return tuple(str(name) for name in record["class_names"])
  from vitboot_jax.data import device_pipeline  # The sources' one reader of class names.

  try:
    return device_pipeline.source_class_names(config)
  except Exception as error:  # Any source's failure: the data is gone or moved.
    raise errors.DataError(
      f"the run records no class names (no data.json) and its data ({config.data.name}, "
      f"config.data.dir={config.data.dir!r}) cannot be read: {errors.first_line(error)}"
    ) from error
