"""The datasets' examples as arrays, without TensorFlow: image folders, `.npz` files, subsets.

Both pipelines read these: input_pipeline.py (tf.data) for its folder listing, `.npz` arrays and
the paper's subsets, device_data.py for everything it places on the devices. An image folder is
ROOT/<split>/<class>/*.{jpg,jpeg,png}, decoded here with PIL; an `.npz` dataset is
DIR/<split>.npz with `images` uint8 [N, H, W, 3], `labels` int [N] and optionally `class_names`
[C] and `file_names` [N] (which order the paper's subsets as tfds' record names do).

Also here, for both pipelines: the folder listing's checks (a class in one split, unsupported or
empty files), `check_split` (a bad test image before training) and `data_fingerprint` (what the
workdir records in data.json, so a resume on other data is refused).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import os
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from vitboot_jax import configlib, errors, files

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
FOLDER_HINT = "point --config.data.dir at a folder with {split}/<class>/*.jpg (or .jpeg/.png)"
NPZ_LAYOUT = (
  "DIR/{split}.npz with 'images' uint8 [N, H, W, 3] and 'labels' int [N] (pack one with "
  "`python -m vitboot_jax.tools.prepare_data NAME --npz_dir=DIR`)"
)
# The sources that need neither TensorFlow nor tfds when config.data.pipeline="device".
ARRAY_SOURCES = ("folder", "npz")


class UnreadableImageError(errors.UsageError, ValueError):
  """An image file or record that cannot be decoded; the message names it and the fix."""


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """Sizes the trainer needs before it sees any batch (schedules, logging, eval padding)."""

  num_train_examples: int  # After config.data.train_fraction.
  num_eval_examples: int
  num_classes: int
  steps_per_epoch: int  # num_train_examples // config.batch_size (the official drop_last).
  class_names: tuple[str, ...]


def uses_tensorflow(config: ml_collections.ConfigDict) -> bool:
  """Whether this run's data needs TensorFlow: the tf.data pipeline, or tfds as the source."""
  return config.data.get("pipeline", "tfdata") == "tfdata" or config.data.name not in ARRAY_SOURCES


def split_field(split: str, train_split: str) -> str:
  """The config field an error about `split` should name."""
  return "train_split" if split == train_split else "eval_split"


# ---------------------------------------------------------------------------------------------
# The paper's subsets.


def subset_indices(
  labels: np.ndarray, fraction: float, file_names: np.ndarray | None = None
) -> np.ndarray:
  """Sorted indices of the official class-balanced subset (docs/reference/official_pytorch_code.md
  §5, `make_partial`).

  Class c's examples, sorted by file name (the official code lists each class folder sorted;
  without `file_names`: in the split's canonical order, which for an image folder is the same),
  are permuted with `np.random.default_rng(seed=c)` and the first round(n_c * fraction) kept.
  The permutation does not depend on `fraction`, so smaller subsets are nested in larger ones.
  `fraction` is in (0, 1] (configlib.validate); one that keeps no example is refused here.
  """
  labels = np.asarray(labels, np.int64)
  if labels.size and labels.min() < 0:
    raise ValueError(f"labels must be non-negative class indices, got {labels.min()}")
  if fraction == 1.0:
    return np.arange(labels.size, dtype=np.int64)
  by_name = np.arange(labels.size) if file_names is None else np.argsort(file_names, kind="stable")
  by_class = by_name[np.argsort(labels[by_name], kind="stable")]  # Within a class: by name.
  counts = np.bincount(labels)
  keep = []
  for c, members in enumerate(np.split(by_class, np.cumsum(counts)[:-1])):
    order = np.random.default_rng(seed=c).permutation(len(members))
    keep.append(members[order[: round(len(members) * fraction)]])
  out = np.sort(np.concatenate(keep)) if keep else np.zeros([0], np.int64)
  if out.size == 0:
    raise ValueError(
      f"config.data.train_fraction={fraction} leaves no training example; use a larger fraction"
    )
  return out


def steps_per_epoch(config: ml_collections.ConfigDict, num_train: int) -> int:
  """Full batches per epoch (the official drop_last); at least one, or the batch is too large."""
  steps = num_train // config.batch_size
  if steps == 0:
    raise ValueError(
      f"config.batch_size={config.batch_size} is larger than the {num_train} training examples "
      f"(config.data.train_fraction={config.data.train_fraction}); use a smaller batch or a "
      "larger fraction"
    )
  return steps


# ---------------------------------------------------------------------------------------------
# Image folders.

LISTING_CACHE: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
# sha256 of each listed split's relative paths and sizes, for the workdir's data record.
FILES_DIGEST: dict[tuple, str] = {}


def class_folders(root: str, split: str, field: str) -> list[str]:
  split_dir = os.path.join(root, split)
  if not os.path.isdir(split_dir):
    raise errors.DataError(
      f"config.data.dir={root!r} has no {split!r} folder (config.data.{field}={split!r}); "
      + FOLDER_HINT.format(split=split)
    )
  classes = sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and e.name[0] != ".")
  if not classes:
    raise errors.DataError(
      f"config.data.dir={root!r}: {split_dir} has no class subfolders; "
      + FOLDER_HINT.format(split=split)
    )
  return classes


def list_folder(
  root: str, split: str, field: str, class_names: tuple[str, ...]
) -> tuple[np.ndarray, np.ndarray]:
  """(paths, labels) in canonical order: classes sorted, then file names sorted."""
  folders = class_folders(root, split, field)
  split_dir = os.path.join(root, split)
  # Cached per directory state, so repeated calls (info, train, eval) list a big folder once.
  key = (
    root,
    split,
    class_names,
    tuple(os.stat(os.path.join(split_dir, c)).st_mtime_ns for c in folders),
  )
  if key in LISTING_CACHE:
    return LISTING_CACHE[key]
  class_index = {name: i for i, name in enumerate(class_names)}
  unknown = [c for c in folders if c not in class_index]
  missing = [c for c in class_names if c not in folders]
  if unknown or missing:
    what = (
      f"classes {unknown[:5]} are only in {split!r}"
      if unknown
      else f"classes {missing[:5]} of the training split have no folder in {split!r}"
    )
    raise errors.DataError(
      f"config.data.dir={root!r}: {what} (config.data.{field}={split!r}); every split must have "
      "the same class folders: add or remove folders so they match"
    )
  paths, labels, sizes, unsupported = [], [], [], []
  for name in folders:
    class_dir = os.path.join(split_dir, name)
    entries = sorted(
      (e for e in os.scandir(class_dir) if e.is_file() and e.name[0] != "."), key=lambda e: e.name
    )
    for e in entries:
      if not e.name.lower().endswith(IMAGE_EXTENSIONS):
        unsupported.append(e.path)
        continue
      paths.append(e.path)
      labels.append(class_index[name])
      sizes.append(e.stat().st_size)  # One stat each: empty files and the data fingerprint.
  if unsupported:
    logging.warning(
      "Skipping %d file(s) in %s that are not %s images: %s%s. Convert them to JPEG/PNG to use "
      "them.",
      len(unsupported),
      split_dir,
      "/".join(IMAGE_EXTENSIONS),
      ", ".join(unsupported[:5]),
      ", ..." if len(unsupported) > 5 else "",
    )
  if not paths:
    raise errors.DataError(
      f"config.data.dir={root!r}: no images under {split_dir}/<class>/; "
      + FOLDER_HINT.format(split=split)
    )
  empty = [p for p, size in zip(paths, sizes) if size == 0]  # Interrupted copies.
  if empty:
    raise UnreadableImageError(unreadable_message(empty, "it is empty (0 bytes)"))
  out = np.array(paths), np.array(labels, np.int64)
  digest = hashlib.sha256()
  for path, size in zip(paths, sizes):
    digest.update(f"{os.path.relpath(path, split_dir)}\t{size}\n".encode())
  LISTING_CACHE[key] = out
  FILES_DIGEST[key[:3]] = digest.hexdigest()
  return out


def unreadable_message(paths: list[str], why: str) -> str:
  more = f" (and {len(paths) - 1} more: {', '.join(paths[1:4])}{', ...' if len(paths) > 4 else ''})"
  return (
    f"Cannot read image file {paths[0]}: {why}{more if len(paths) > 1 else ''}. Replace or "
    "delete the file(s) and re-run the same command (a run in progress resumes from its last "
    "checkpoint)."
  )


def read_image(path: str) -> np.ndarray:
  """uint8 [H, W, 3] of a JPEG/PNG file with PIL (grey, palette and CMYK become RGB)."""
  from PIL import Image  # Only the TensorFlow-free pipeline decodes with PIL.

  with Image.open(path) as image:
    return np.asarray(image.convert("RGB"), dtype=np.uint8)


def read_images(paths: np.ndarray, threads: int | None = None, stored: int = 0) -> np.ndarray:
  """uint8 [N, H, W, 3] of same-sized images; an unreadable or odd-sized file is named, and with
  `stored` (configlib.device_resize_from) every image not `stored` square."""
  if not len(paths):
    return np.zeros([0, 0, 0, 3], np.uint8)

  def read(path: str) -> np.ndarray | Exception:
    try:
      return read_image(path)
    except Exception as error:  # PIL raises several types; each is the file's fault here.
      return error

  with concurrent.futures.ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
    images = list(pool.map(read, paths.tolist()))
  bad = [(p, e) for p, e in zip(paths.tolist(), images) if isinstance(e, Exception)]
  if bad:
    why = " ".join(str(bad[0][1]).split())[:200]
    raise UnreadableImageError(
      unreadable_message([p for p, _ in bad], f"it is not a complete JPEG/PNG image: {why}")
    )
  if stored:
    wrong = [
      f"{p} ({image.shape[0]}x{image.shape[1]})"
      for p, image in zip(paths.tolist(), images)
      if image.shape[:2] != (stored, stored)
    ]
    if wrong:
      raise errors.ConfigError(wrong_size_message(stored, wrong))
  shape = images[0].shape
  odd = [p for p, image in zip(paths.tolist(), images) if image.shape != shape]
  if odd:
    other = images[paths.tolist().index(odd[0])].shape
    raise errors.DataError(
      f"config.data.pipeline='device' holds a split as one array, so its images must share one "
      f"size: {paths[0]} is {shape[0]}x{shape[1]} but {odd[0]} is {other[0]}x{other[1]} "
      f"({len(odd)} differ); resize them to one size or use --config.data.pipeline=tfdata"
    )
  return np.stack(images)


# ---------------------------------------------------------------------------------------------
# Checks before training.

STORED_SIZE_FIX = "set --config.data.stored_size=0 (resize on the host) or resize the images"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_END = b"IEND\xaeB`\x82"


def wrong_size_message(stored: int, wrong: list[str]) -> str:
  """One line naming the first of the `wrong` ("PATH (WxH)") images that are not `stored` square."""
  more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
  first = wrong[0] if wrong else "one of them"
  return (
    f"config.data.stored_size={stored} but image file {first}{more} is not {stored}x{stored}; "
    + STORED_SIZE_FIX
  )


def check_stored_size(config: ml_collections.ConfigDict, images: np.ndarray, where: str) -> None:
  """Fails unless a split read as one array (`where`: its file or name) is stored_size square."""
  stored = configlib.device_resize_from(config)
  if stored and images.shape[1:3] != (stored, stored):
    raise errors.ConfigError(
      f"config.data.stored_size={stored} but the images of {where} are "
      f"{images.shape[1]}x{images.shape[2]}, not {stored}x{stored}; " + STORED_SIZE_FIX
    )


def check_split(config: ml_collections.ConfigDict, split: str, max_files: int = 20000) -> None:
  """Checks an image folder's `split` before a tf.data run trains, if it has at most
  `max_files` (CIFAR's test split), so a bad file stops the run at once rather than at its first
  evaluation (the device pipeline decodes and checks every image as it loads them).

  Reads only each file's first and last bytes (CIFAR's 10k test files: well under a second;
  decoding them all took 21 s on 2 cores): a file that does not start and end like a complete
  JPEG/PNG (an interrupted copy) is then decoded by TensorFlow, as the run reads it, so a valid
  file is never refused. A PNG's
  size is checked against config.data.stored_size from its header; a JPEG's, and any damage
  inside a file, are found when the file is read. Larger splits, .npz files and tfds datasets
  are checked as they are read.

  Raises:
    UnreadableImageError: A file does not decode (named).
    errors.ConfigError: A PNG's size differs from config.data.stored_size (named).
  """
  if config.data.name != "folder":
    return
  root, train_split = config.data.dir, config.data.train_split
  classes = tuple(class_folders(root, train_split, "train_split"))
  paths = list_folder(root, split, split_field(split, train_split), classes)[0]
  if len(paths) > max_files:
    return
  stored = configlib.device_resize_from(config)
  suspects, wrong = [], []
  for path in paths.tolist():
    with open(path, "rb") as f:
      head = f.read(24)
      f.seek(max(0, os.fstat(f.fileno()).st_size - 32))
      tail = f.read()
    if head.startswith(_PNG_SIGNATURE):
      complete = tail.endswith(_PNG_END)
      size = (int.from_bytes(head[20:24], "big"), int.from_bytes(head[16:20], "big"))
      if stored and complete and size != (stored, stored):
        wrong.append(f"{path} ({size[0]}x{size[1]})")
    else:
      complete = head.startswith(b"\xff\xd8") and b"\xff\xd9" in tail
    if not complete:
      suspects.append(path)
  if suspects:
    from vitboot_jax.data import input_pipeline  # The tf.data pipeline: TensorFlow is there.

    message = input_pipeline.unreadable_files(np.array(suspects))
    if message is not None:
      raise UnreadableImageError(message)
  if wrong:
    raise errors.ConfigError(wrong_size_message(stored, wrong))


# ---------------------------------------------------------------------------------------------
# The workdir's record of the data.


def data_fingerprint(config: ml_collections.ConfigDict, info: DatasetInfo) -> dict[str, Any]:
  """What a run trains on, recorded in its workdir so a resume on other data is refused.

  Per split, its example count and: for an image folder, a sha256 of the file list (paths
  relative to the split, and sizes); for an .npz, a sha256 of its images' and labels' bytes
  (a fraction of a second at CIFAR scale, docs/performance.md; the file's own bytes change with
  every write's zip timestamps); for a tfds dataset, the dataset's version (read through tfds,
  hence TensorFlow, which a tfds run has). All: class names, training examples and steps per
  epoch.
  """
  name, train_split = config.data.name, config.data.train_split
  split_names = list(dict.fromkeys((train_split, config.data.eval_split)))
  record: dict[str, Any] = {"name": name}
  if name == "folder":
    classes = tuple(class_folders(config.data.dir, train_split, "train_split"))
    splits = {}
    for split in split_names:
      paths, _ = list_folder(config.data.dir, split, split_field(split, train_split), classes)
      digest = FILES_DIGEST[(config.data.dir, split, classes)]
      splits[split] = {"examples": len(paths), "files_sha256": digest}
  elif name == "npz":
    splits = {}
    for split in split_names:
      arrays = read_npz(config.data.dir, split, train_split)
      digest = hashlib.sha256()
      for key in ("images", "labels"):
        digest.update(f"{key}{arrays[key].dtype}{arrays[key].shape}".encode())
        digest.update(np.ascontiguousarray(arrays[key]).data)
      splits[split] = {"examples": len(arrays["labels"]), "arrays_sha256": digest.hexdigest()}
  else:
    from vitboot_jax.data import input_pipeline  # tfds reads through TensorFlow.

    record["version"], counts = input_pipeline.tfds_record(config)
    splits = {split: {"examples": count} for split, count in counts.items()}
  record.update(
    splits=splits,
    class_names=list(info.class_names),
    num_train_examples=info.num_train_examples,
    steps_per_epoch=info.steps_per_epoch,
  )
  return record


# ---------------------------------------------------------------------------------------------
# .npz datasets.

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
        f"{split_field(split, config.data.train_split)}={split!r}); an npz dataset is "
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
      f"{split_field(split, train_split)}={split!r}); an npz dataset is "
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


def check_labels(labels: np.ndarray, num_classes: int, where: str) -> None:
  if labels.size and labels.max() >= num_classes:
    raise errors.DataError(
      f"{where} has label {labels.max()} but there are {num_classes} classes; set "
      f"--config.data.num_classes={labels.max() + 1} (or fix the labels)"
    )


def write_npz(path: str, images: np.ndarray, labels: np.ndarray, **extra: np.ndarray) -> None:
  """Writes one split atomically (uncompressed: CIFAR's uint8 pixels barely compress)."""
  with files.replacing(path) as f:
    np.savez(f, images=np.asarray(images, np.uint8), labels=np.asarray(labels, np.int64), **extra)


# ---------------------------------------------------------------------------------------------
# A split as arrays, TensorFlow-free for folders and .npz.


def split_arrays(
  config: ml_collections.ConfigDict, split: str, subset: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(images uint8 [N, H, W, 3], labels int64 [N], index int64 [N]) of a folder or .npz split.

  `index` is each example's position in the split's canonical order (what augmentation is keyed
  by); with `subset`, only config.data.train_fraction's examples, in that order.
  """
  train_split = config.data.train_split
  name = config.data.name
  if name == "npz":
    arrays = read_npz(config.data.dir, split, train_split)
    labels = arrays["labels"]
    check_labels(labels, config.data.num_classes, npz_path(config.data.dir, split))
    index = np.arange(len(labels), dtype=np.int64)
    if subset:
      index = subset_indices(labels, config.data.train_fraction, arrays.get("file_names"))
    return arrays["images"][index], labels[index], index
  if name != "folder":
    raise ValueError(f"split_arrays reads folders and .npz files, not {name!r}")
  classes = tuple(class_folders(config.data.dir, train_split, "train_split"))
  paths, labels = list_folder(config.data.dir, split, split_field(split, train_split), classes)
  index = np.arange(len(labels), dtype=np.int64)
  if subset:
    index = subset_indices(labels, config.data.train_fraction)
  stored = configlib.device_resize_from(config)
  return read_images(paths[index], stored=stored), labels[index], index
