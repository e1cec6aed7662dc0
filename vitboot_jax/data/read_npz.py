"""`.npz` datasets without TensorFlow: DIR/<split>.npz with `images` uint8 [N, H, W, 3], `labels`
int [N] and optionally `class_names` [C] and `file_names` [N] (which order the paper's subsets as
tfds' record names do). Both pipelines read these files; prepare_data writes them.
"""

from __future__ import annotations

import os

import ml_collections
import numpy as np

from vitboot_jax.base import errors, files
from vitboot_jax.data import splits

NPZ_LAYOUT = (
  "DIR/{split}.npz with 'images' uint8 [N, H, W, 3] and 'labels' int [N] (pack one with "
  "`python -m vitboot_jax.tools.prepare_data NAME --npz_dir=DIR`)"
)
_NPZ_CACHE: dict[tuple, dict[str, np.ndarray]] = {}


def npz_path(root: str | None, split: str) -> str:
  return os.path.join(root or "", f"{split}.npz")


def check_npz_dir(config: ml_collections.ConfigDict) -> None:
  """Fails with the layout unless config.data.dir holds the train and eval .npz files."""
  root = config.data.dir
  for split in (config.data.train_split, config.data.eval_split):
    if not root or not os.path.isfile(npz_path(root, split)):
      where = "is not set" if not root else f"has no {split}.npz"
      raise errors.DataError(
        f"config.data.dir={root!r} {where} (config.data.name='npz', config.data."
        f"{splits.split_field(split, config.data.train_split)}={split!r}); an npz dataset is "
        + NPZ_LAYOUT.format(split=split)
      )


def read_npz(root: str | None, split: str, train_split: str = "train") -> dict[str, np.ndarray]:
  """{"images", "labels"[, "class_names", "file_names"]} of DIR/<split>.npz, checked.

  Raises errors.DataError naming the file, the key and what it must be.
  """
  path = npz_path(root, split)
  if not root or not os.path.isfile(path):
    raise errors.DataError(
      f"config.data.dir={root!r} has no {split}.npz (config.data."
      f"{splits.split_field(split, train_split)}={split!r}); an npz dataset is "
      + NPZ_LAYOUT.format(split=split)
    )
  key = (path, os.stat(path).st_mtime_ns)
  if key in _NPZ_CACHE:
    return _NPZ_CACHE[key]
  try:
    with np.load(path, allow_pickle=False) as npz:
      arrays = {k: npz[k] for k in npz.files}
  except Exception as error:  # A truncated or foreign file: zipfile/np.load errors vary.
    raise errors.DataError(
      f"Cannot read {path} as an .npz ({' '.join(str(error).split())[:200]}); write it again "
      "as " + NPZ_LAYOUT.format(split=split)
    ) from error
  missing = [k for k in ("images", "labels") if k not in arrays]
  if missing:
    raise errors.DataError(
      f"{path} has keys {sorted(arrays)} but no {missing}; it must hold "
      + NPZ_LAYOUT.format(split=split)
    )
  images, labels = arrays["images"], arrays["labels"]
  problems = []
  if images.dtype != np.uint8:
    problems.append(f"'images' is {images.dtype}, not uint8 (0-255)")
  if images.ndim != 4 or images.shape[-1] != 3:
    problems.append(f"'images' has shape {list(images.shape)}, not [N, H, W, 3]")
  if not np.issubdtype(labels.dtype, np.integer):
    problems.append(f"'labels' is {labels.dtype}, not an integer type")
  if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
    problems.append(f"'labels' has shape {list(labels.shape)}, not [{images.shape[0]}]")
  elif labels.size and labels.min() < 0:
    problems.append(f"'labels' holds {labels.min()}, not a class index >= 0")
  for name in ("class_names", "file_names"):
    if name in arrays and arrays[name].ndim != 1:
      problems.append(f"'{name}' has shape {list(arrays[name].shape)}, not one dimension")
  if "file_names" in arrays and arrays["file_names"].shape[0] != images.shape[0]:
    problems.append(f"'file_names' has {arrays['file_names'].shape[0]} entries, not {len(images)}")
  if problems:
    raise errors.DataError(
      f"{path}: {'; '.join(problems)}; write it as " + NPZ_LAYOUT.format(split=split)
    )
  arrays["labels"] = labels.astype(np.int64)
  _NPZ_CACHE.clear()  # One dataset at a time: a split can be hundreds of MB.
  _NPZ_CACHE[key] = arrays
  return arrays


def npz_class_names(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The training split's `class_names`, else "0".."C-1" for config.data.num_classes."""
  arrays = read_npz(config.data.dir, config.data.train_split, config.data.train_split)
  if "class_names" in arrays:
    return tuple(str(n) for n in arrays["class_names"].tolist())
  return tuple(str(c) for c in range(config.data.num_classes))


def write_npz(path: str, images: np.ndarray, labels: np.ndarray, **extra: np.ndarray) -> None:
  """Writes one split atomically (uncompressed: CIFAR's uint8 pixels barely compress)."""
  with files.replacing(path) as f:
    np.savez(f, images=np.asarray(images, np.uint8), labels=np.asarray(labels, np.int64), **extra)


def npz_arrays(
  config: ml_collections.ConfigDict, part: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(images uint8 [N, H, W, 3], labels int64 [N], index int64 [N]) of an .npz `part`; `index`
  and `part` as read_folders.folder_arrays'."""
  split = splits.part_split(config, part)
  arrays = read_npz(config.data.dir, split, config.data.train_split)
  labels = arrays["labels"]
  splits.check_labels(labels, config.data.num_classes, npz_path(config.data.dir, split))
  names = tuple(str(n) for n in arrays.get("class_names", np.zeros([0], str)).tolist())
  index = splits.part_rows(config, part, labels, arrays.get("file_names"), names)
  return arrays["images"][index], labels[index], index
